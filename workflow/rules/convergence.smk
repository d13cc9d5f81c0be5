# Stage convergence: the native recipe trained convergence.steps steps from the fetched weights on the training
# corpus, its loss on the held-out split (fetch_corpus's, read by no training run) measured after step 1 and every
# convergence.eval_every steps; it measures (measured.json) and rule judge holds the curves to convergence.min_fall
# and convergence.max_spike_ratio, so a threshold edit re-judges without training again.


rule convergence:
    input:
        unpack(get_fetched_weights),
        unpack(get_fail_fast),
        **train_inputs(*CONVERGENCE.packages),
        heldout="results/fetch_corpus/heldout",
    output:
        run=directory("results/convergence/run"),
        recipe="results/convergence/recipe.json",
        measured="results/convergence/measured.json",
    log:
        "logs/convergence/convergence.log",
    benchmark:
        "benchmarks/convergence.tsv"
    conda:
        SOFTWARE_ENV
    threads: ALL_CORES
    resources:
        **get_instance_resources(),
    params:
        code=get_code("convergence.py"),
        backend=get_backend_config(),
        training=stage_training(config, CONVERGENCE.stage),
        convergence=stage_measuring(config, "convergence"),
        kernels=get_kernel_rules(CONVERGENCE.stage),
        dataset=config["data"]["dataset"],
    message:
        get_launch_message("convergence", "qwen3_pilot.titan.in_ranks.train_entry")
    script:
        "../scripts/convergence.py"
