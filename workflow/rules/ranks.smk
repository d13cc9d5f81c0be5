# Stage verify_ranks: the configured ranks launched for real, plus the 64-rank FSDP plan of the real
# Qwen3-4B validated offline with torchtitan's fake process group.


rule verify_ranks:
    input:
        pin_stamps("torch", "torchtitan", *DEVICE_PACKAGES, *RANK_CHECK_PACKAGES),
    output:
        ranks=directory("results/verify_ranks/ranks"),
        plan="results/verify_ranks/plan.json",
        summary="results/verify_ranks/summary.json",
    log:
        "logs/verify_ranks/verify_ranks.log",
    benchmark:
        "benchmarks/verify_ranks.tsv"
    conda:
        SOFTWARE_ENV
    threads: ALL_CORES
    resources:
        **get_instance_resources(),
    params:
        code=get_code("verify_ranks.py"),
        backend=get_backend_config(),
        plan=config["plan"],
        collectives=config["verify_ranks"]["collectives"],
    message:
        get_launch_message("verify_ranks", "qwen3_pilot.titan.in_ranks.rank_worker")
    script:
        "../scripts/verify_ranks.py"
