# Stages train_hf and train_native: torchtitan's trainer on both 4B recipes, from the fetched weights,
# each with a random-init control on the same batch; then the two recipes' step-1 losses compared.


def train_inputs(*packages):
    return {
        "stamps": pin_stamps(*packages),
        "checkpoint": "results/fetch_weights/checkpoint",
        "weights": "results/fetch_weights/summary.json",
        "corpus": "results/fetch_corpus/c4_test",
        "ranks": "results/verify_ranks/summary.json",
    }


TRAIN_PACKAGES = {
    # The native recipe loads safetensors through torchtitan's state-dict adapter; no transformers.
    "train_native": ("torch", "torchtitan", "safetensors", "tokenizers"),
    "train_hf": ("torch", "torchtitan", "safetensors", "tokenizers", "transformers"),
}


rule train_hf:
    input:
        **train_inputs(*TRAIN_PACKAGES["train_hf"]),
    output:
        run=directory("results/train_hf/run"),
        control=directory("results/train_hf/control"),
        recipe="results/train_hf/recipe.json",
        summary="results/train_hf/summary.json",
    log:
        "logs/train_hf/train_hf.log",
    benchmark:
        "benchmarks/train_hf.tsv"
    conda:
        SOFTWARE_ENV
    params:
        backend=get_backend_config(),
        training=config["training"],
        dataset=config["data"]["dataset"],
        cache_root=CACHE_ROOT,
    threads: workflow.cores
    script:
        "../workflow/scripts/train.py"


rule train_native:
    input:
        **train_inputs(*TRAIN_PACKAGES["train_native"]),
    output:
        run=directory("results/train_native/run"),
        control=directory("results/train_native/control"),
        recipe="results/train_native/recipe.json",
        summary="results/train_native/summary.json",
    log:
        "logs/train_native/train_native.log",
    benchmark:
        "benchmarks/train_native.tsv"
    conda:
        SOFTWARE_ENV
    params:
        backend=get_backend_config(),
        training=config["training"],
        dataset=config["data"]["dataset"],
        cache_root=CACHE_ROOT,
    threads: workflow.cores
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
    conda:
        SOFTWARE_ENV
    params:
        tolerance=config["training"]["recipe_agreement_tolerance"],
        backend=BACKEND,
    script:
        "../workflow/scripts/compare_recipes.py"
