# Training and what is checked on it: train_hf and train_native (torchtitan's trainer on both 4B recipes,
# from the fetched weights, each with a random-init control on the same batch, launched twice where
# training.repeat lists the recipe), compare_recipes,
# export_reload, kernel_numerics and moe_reduced. Each of these but compare_recipes measures (measured.json)
# and rule judge judges (summary.json), the benchmark's measured.json too: a threshold or tolerance edit
# re-judges without measuring again.


# One rule for both 4B recipes: {stage} is train_hf or train_native. The pins each recipe depends on
# (qwen3_pilot/recipe_registry.py) and its kernel replacements (config kernels.<stage>) are per recipe, so a bump or a
# kernel change reruns only the recipe that uses it. `plain` holds the run without kernel replacements, and stays empty
# when the recipe has none; `repeat` the control's second launch, empty when the recipe is not repeated.
rule train:
    input:
        unpack(get_fetched_weights),
        unpack(get_fail_fast),
        unpack(get_train_inputs),
    output:
        run=directory("results/{stage}/run"),
        control=directory("results/{stage}/control"),
        plain=directory("results/{stage}/plain"),
        repeat=directory("results/{stage}/repeat"),
        recipe="results/{stage}/recipe.json",
        measured="results/{stage}/measured.json",
    log:
        "logs/{stage}/{stage}.log",
    benchmark:
        "benchmarks/{stage}.tsv"
    wildcard_constraints:
        stage="|".join(FROM_FETCHED_WEIGHTS_STAGES),
    conda:
        SOFTWARE_ENV
    threads: ALL_CORES
    resources:
        **get_instance_resources(),
    params:
        code=get_code("train.py"),
        backend=get_backend_config(),
        training=get_training,
        repeat_steps=get_repeat_steps,
        kernels=get_recipe_kernel_rules,
        dataset=config["data"]["dataset"],
    message:
        get_launch_message(
            "{wildcards.stage}", "qwen3_pilot.titan.in_ranks.train_entry"
        )
    script:
        "../scripts/train.py"


# A stage's measured figures held to the thresholds it is judged by (config.stage_judging: the
# loaded-weights gate, accepted differences' reasons, kernels.loss_tolerance, export_reload's and
# kernel_numerics' tolerances), into its summary.json. A second's work on the records: it runs where
# Snakemake runs, never as a cluster job.
localrules:
    judge,


rule judge:
    input:
        unpack(get_replanned_after_checkpoints),
        measured="results/{stage}/measured.json",
    output:
        summary="results/{stage}/summary.json",
    log:
        "logs/{stage}/judge.log",
    wildcard_constraints:
        stage="|".join(JUDGED_STAGES),
    conda:
        SOFTWARE_ENV
    params:
        code=get_code("judge.py"),
        judging=get_judging,
    script:
        "../scripts/judge.py"


# Same weights, same first batch: the two recipes must agree on the step-1 loss. Two records compared: it runs
# where Snakemake runs (a cluster job would cost more than the work).
localrules:
    compare_recipes,


rule compare_recipes:
    input:
        unpack(get_replanned_after_checkpoints),
        train_hf="results/train_hf/summary.json",
        train_native="results/train_native/summary.json",
    output:
        summary="results/compare_recipes/summary.json",
    log:
        "logs/compare_recipes/compare_recipes.log",
    benchmark:
        "benchmarks/compare_recipes.tsv"
    conda:
        SOFTWARE_ENV
    params:
        code=get_code("compare_recipes.py"),
        tolerance=config["training"]["recipe_agreement_tolerance"],
        backend=BACKEND,
    script:
        "../scripts/compare_recipes.py"


# Each recipe's HF export at its last step, completed and reloaded with transformers; runs on the host CPU
# (of an instance: the 4B checkpoints need its memory).
rule export_reload:
    input:
        unpack(get_fetched_weights),
        unpack(get_export_reload_replanned),
        stamps=pin_stamps(
            "torch", "torchtitan", "safetensors", "tokenizers", "transformers"
        ),
        hf="results/train_hf/run",
        native="results/train_native/run",
        # The judged runs: only a run that passed its checks is exported; each summary names its export folder.
        # Not ancient(): Snakemake then never checks this job's own params and code once an upstream judge
        # reruns (it skips jobs downstream of a rerun, and an ancient edge does not bring them back).
        hf_summary="results/train_hf/summary.json",
        native_summary="results/train_native/summary.json",
    output:
        hf=directory("results/export_reload/hf"),
        native=directory("results/export_reload/native"),
        measured="results/export_reload/measured.json",
    log:
        "logs/export_reload/export_reload.log",
    benchmark:
        "benchmarks/export_reload.tsv"
    conda:
        SOFTWARE_ENV
    resources:
        **get_instance_resources(nodes=1),
    params:
        code=get_code("export_reload.py"),
        settings=stage_measuring(config, "export_reload"),
        seed=config["training"]["seed"],
        backend=BACKEND,
    script:
        "../scripts/export_reload.py"


# The reduced MoE: Qwen3-30B-A3B's architecture, 4 layers, 64 experts, top-4, from random init, with its
# RoPE and experts replaced by the backend's kernels (the seed's third configuration), then without them.
rule moe_reduced:
    input:
        unpack(get_fetched_weights),
        unpack(get_fail_fast),
        **train_inputs(*recipe_of("moe_reduced").packages),
    output:
        run=directory("results/moe_reduced/run"),
        plain=directory("results/moe_reduced/plain"),
        recipe="results/moe_reduced/recipe.json",
        measured="results/moe_reduced/measured.json",
    log:
        "logs/moe_reduced/moe_reduced.log",
    benchmark:
        "benchmarks/moe_reduced.tsv"
    conda:
        SOFTWARE_ENV
    threads: ALL_CORES
    resources:
        **get_instance_resources(),
    params:
        code=get_code("moe_reduced.py"),
        backend=get_backend_config(),
        training=stage_training(config, "moe_reduced"),
        moe=config["moe"],
        kernels=get_kernel_rules("moe_reduced"),
        dataset=config["data"]["dataset"],
    message:
        get_launch_message("moe_reduced", "qwen3_pilot.titan.in_ranks.train_entry")
    script:
        "../scripts/moe_reduced.py"


# RoPE and MoE-experts kernels against torchtitan's PyTorch modules; the replaced model trains and compiles.
rule kernel_numerics:
    input:
        unpack(get_fail_fast),
        stamps=pin_stamps("torch", "torchtitan", *DEVICE_PACKAGES),
    output:
        measured="results/kernel_numerics/measured.json",
    log:
        "logs/kernel_numerics/kernel_numerics.log",
    benchmark:
        "benchmarks/kernel_numerics.tsv"
    conda:
        SOFTWARE_ENV
    resources:
        **get_instance_resources(nodes=1),
    params:
        code=get_code("kernel_numerics.py"),
        backend=get_backend_config(),
        settings=stage_measuring(config, "kernel_numerics"),
    script:
        "../scripts/kernel_numerics.py"
