# Stage fail_fast: every recipe launched as its stage would launch it, at tiny widths for a few steps on two ranks,
# and one decoder block with the kernel replacements under the backend's compiler: minutes, where the real stages
# take the instance's hours. A checkpoint: every device stage reads its passed.json (get_fail_fast), a record of which
# checks passed and nothing else, so that a rerun which passes the same checks reruns none of them.


checkpoint fail_fast:
    input:
        unpack(get_fetched_weights),
        stamps=pin_stamps(*RECIPE_PACKAGES, *DEVICE_PACKAGES),
        corpus="results/fetch_corpus/c4_test",
        corpus_summary="results/fetch_corpus/summary.json",
    output:
        work=directory("results/fail_fast/work"),
        passed="results/fail_fast/passed.json",
        summary="results/fail_fast/summary.json",
    log:
        "logs/fail_fast/fail_fast.log",
    benchmark:
        "benchmarks/fail_fast.tsv"
    conda:
        SOFTWARE_ENV
    threads: ALL_CORES
    resources:
        **get_instance_resources(nodes=1),
    params:
        code=get_code("fail_fast.py"),
        backend=get_backend_config(),
        settings=config["fail_fast"],
        training=fail_fast_training(config),
        kernels=get_fail_fast_kernel_rules(),
        moe=get_fail_fast_moe(),
        dataset=config["data"]["dataset"],
    message:
        get_launch_message("fail_fast", "qwen3_pilot.titan.in_ranks.train_entry")
    script:
        "../scripts/fail_fast.py"
