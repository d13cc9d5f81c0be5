# Stage benchmark: warm-up and steady state apart, eager against compiled (cold and warm compile cache),
# replaced kernels against plain, per configured recipe (config benchmark).


rule benchmark:
    input:
        **get_benchmark_inputs(),
    output:
        runs=directory("results/benchmark/runs"),
        summary="results/benchmark/summary.json",
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
        backend=get_backend_config(),
        training=get_benchmark_training(),
        moe=config["moe"],
        kernels=get_benchmark_kernel_rules(),
        settings=config["benchmark"],
        dataset=config["data"]["dataset"],
    message:
        get_launch_message("benchmark", "qwen3_pilot.titan.in_ranks.train_entry")
    script:
        "../workflow/scripts/benchmark.py"
