# Training and what is checked on it: train_hf and train_native (torchtitan's trainer on both 4B recipes,
# from the fetched weights, each with a random-init control on the same batch), compare_recipes,
# export_reload, kernel_numerics and moe_reduced.


# One rule for both 4B recipes: {recipe} is train_hf or train_native. The pins each recipe depends on
# (TRAIN_PACKAGES) and its kernel replacements (config kernels.<recipe>) are per recipe, so a bump or a
# kernel change reruns only the recipe that uses it. `plain` holds the run without kernel replacements, and
# stays empty when the recipe has none.
rule train:
    input:
        unpack(get_train_inputs),
    output:
        run=directory("results/{recipe}/run"),
        control=directory("results/{recipe}/control"),
        plain=directory("results/{recipe}/plain"),
        recipe="results/{recipe}/recipe.json",
        summary="results/{recipe}/summary.json",
    log:
        "logs/{recipe}/{recipe}.log",
    benchmark:
        "benchmarks/{recipe}.tsv"
    wildcard_constraints:
        recipe="|".join(TRAIN_PACKAGES),
    conda:
        SOFTWARE_ENV
    threads: ALL_CORES
    resources:
        **get_instance_resources(),
    params:
        backend=get_backend_config(),
        training=get_training,
        kernels=get_recipe_kernel_rules,
        dataset=config["data"]["dataset"],
        cache_root=CACHE_ROOT,
    message:
        get_launch_message("{wildcards.recipe}", "qwen3_pilot.in_ranks.train_entry")
    script:
        "../workflow/scripts/train.py"


# Same weights, same first batch: the two recipes must agree on the step-1 loss.
rule compare_recipes:
    input:
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
    resources:
        **get_small_resources(),
    params:
        tolerance=config["training"]["recipe_agreement_tolerance"],
        backend=BACKEND,
    script:
        "../workflow/scripts/compare_recipes.py"


# Each recipe's HF export at its last step, completed and reloaded with transformers; runs on the host CPU
# (of an instance: the 4B checkpoints need its memory).
rule export_reload:
    input:
        stamps=pin_stamps(
            "torch", "torchtitan", "safetensors", "tokenizers", "transformers"
        ),
        checkpoint="results/fetch_weights/checkpoint",
        weights="results/fetch_weights/summary.json",
        hf="results/train_hf/run",
        native="results/train_native/run",
        hf_summary="results/train_hf/summary.json",
        native_summary="results/train_native/summary.json",
    output:
        hf=directory("results/export_reload/hf"),
        native=directory("results/export_reload/native"),
        summary="results/export_reload/summary.json",
    log:
        "logs/export_reload/export_reload.log",
    benchmark:
        "benchmarks/export_reload.tsv"
    conda:
        SOFTWARE_ENV
    resources:
        **get_instance_resources(nodes=1),
    params:
        settings=config["export_reload"],
        steps=config["training"]["steps"],
        seed=config["training"]["seed"],
        backend=BACKEND,
    script:
        "../workflow/scripts/export_reload.py"


# The reduced MoE: Qwen3-30B-A3B's architecture, 4 layers, 64 experts, top-4, from random init, with its
# RoPE and experts replaced by the backend's kernels (the seed's third configuration), then without them.
rule moe_reduced:
    input:
        **train_inputs(*MOE_PACKAGES),
    output:
        run=directory("results/moe_reduced/run"),
        plain=directory("results/moe_reduced/plain"),
        recipe="results/moe_reduced/recipe.json",
        summary="results/moe_reduced/summary.json",
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
        backend=get_backend_config(),
        training=stage_training(config, "moe_reduced"),
        moe=config["moe"],
        kernels=get_kernel_rules("moe_reduced"),
        dataset=config["data"]["dataset"],
        cache_root=CACHE_ROOT,
    message:
        get_launch_message("moe_reduced", "qwen3_pilot.in_ranks.train_entry")
    script:
        "../workflow/scripts/moe_reduced.py"


# RoPE and MoE-experts kernels against torchtitan's PyTorch modules; the replaced model trains and compiles.
rule kernel_numerics:
    input:
        stamps=pin_stamps("torch", "torchtitan", *BACKEND_PACKAGES),
    output:
        results="results/kernel_numerics/numerics.json",
        summary="results/kernel_numerics/summary.json",
    log:
        "logs/kernel_numerics/kernel_numerics.log",
    benchmark:
        "benchmarks/kernel_numerics.tsv"
    conda:
        SOFTWARE_ENV
    resources:
        **get_instance_resources(nodes=1),
    params:
        backend=get_backend_config(),
        settings=config["kernel_numerics"],
        cache_root=CACHE_ROOT,
    script:
        "../workflow/scripts/kernel_numerics.py"
