# Stage benchmark: warm-up and steady state apart, eager against compiled (cold and warm compile cache),
# replaced kernels against plain, per configured recipe (config benchmark): measured.json, which rule judge
# (train.smk) flags noisy and prices (benchmark.noisy_cv, cost, price_per_hour) without measuring again.


rule benchmark:
    input:
        unpack(get_fetched_weights),
        unpack(get_fail_fast),
        **get_benchmark_inputs(),
    output:
        runs=directory("results/benchmark/runs"),
        measured="results/benchmark/measured.json",
    log:
        "logs/benchmark/benchmark.log",
    benchmark:
        "benchmarks/benchmark.tsv"
    conda:
        SOFTWARE_ENV
    threads: ALL_CORES
    resources:
        **get_instance_resources(),
    params:
        code=get_code("benchmark.py"),
        backend=get_backend_config(),
        training=get_benchmark_training(),
        moe=config["moe"],
        kernels=get_benchmark_kernel_rules(),
        settings=stage_measuring(config, "benchmark"),
        dataset=config["data"]["dataset"],
    message:
        get_launch_message("benchmark", "qwen3_pilot.titan.in_ranks.train_entry")
    script:
        "../scripts/benchmark.py"
