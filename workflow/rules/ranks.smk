# Stage verify_ranks: the configured ranks launched for real, the collectives timed (and, on neuron,
# nccom-test beside them where it is installed), plus the 64-rank FSDP plan of the real Qwen3-4B validated offline
# with torchtitan's fake process group. It measures (measured.json); rule judge holds the bus bandwidth to
# verify_ranks.floor, so a floor edit re-judges without launching again. The stages that train read the measured
# record (the peak FLOPS), not the verdict: a floor edit reruns none of them.


rule verify_ranks:
    input:
        pin_stamps("torch", "torchtitan", *DEVICE_PACKAGES, *RANK_CHECK_PACKAGES),
    output:
        ranks=directory("results/verify_ranks/ranks"),
        plan="results/verify_ranks/plan.json",
        measured="results/verify_ranks/measured.json",
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
        collectives=stage_measuring(config, "verify_ranks")["collectives"],
    message:
        get_launch_message("verify_ranks", "qwen3_pilot.titan.in_ranks.rank_worker")
    script:
        "../scripts/verify_ranks.py"
