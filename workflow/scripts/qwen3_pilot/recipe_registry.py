"""The training recipes, one record each. Every list of recipes in the pilot is derived from RECIPES: the stages
rule `train` serves and the pins each recipe's training depends on (workflow/rules/common.smk), the config function
a trainer is started with (training.py), the recipes the loaded-weights gate judges, what export_reload reloads,
the recipes whose torchtitan names are checked (titan/titan_api.py), the compatibility matrix's columns and the
preflight's launches. Adding a recipe is a record here and its config function in titan/in_ranks/recipes.py.

Torch-free; read at parse time.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Recipe:
    # The stage that trains it, and names it in config (training.<stage>, kernels.<stage>) and in results/.
    stage: str
    # Its config function in titan/in_ranks/recipes.py: what a trainer is started with (--config).
    config_function: str
    # The pinned packages its training imports: a bump of one reruns the recipe's stage, and no other's.
    packages: tuple[str, ...]
    # export_reload's name for the recipe's HF export, for a recipe trained from the fetched weights (rule train:
    # a random-init control beside it, the loaded-weights gate, the export); None for one trained from random init.
    export: str | None = None

    @property
    def from_fetched_weights(self) -> bool:
        return self.export is not None


RECIPES = (
    # The native recipe loads safetensors through torchtitan's state-dict adapter; no transformers.
    Recipe("train_native", "qwen3_native", ("torch", "torchtitan", "safetensors", "tokenizers"), export="native"),
    Recipe("train_hf", "qwen3_hf", ("torch", "torchtitan", "safetensors", "tokenizers", "transformers"), export="hf"),
    # The reduced MoE trains from random init: nothing is read with safetensors.
    Recipe("moe_reduced", "qwen3_moe_reduced", ("torch", "torchtitan", "tokenizers")),
)
BY_STAGE = {recipe.stage: recipe for recipe in RECIPES}
# Rule train's stages: the recipes trained from the fetched weights, each judged by the loaded-weights gate.
FROM_FETCHED_WEIGHTS = tuple(recipe for recipe in RECIPES if recipe.from_fetched_weights)
# Their stages: rule train's {stage}, the stages the loaded-weights gate judges, what compare_recipes compares.
FROM_FETCHED_WEIGHTS_STAGES = tuple(recipe.stage for recipe in FROM_FETCHED_WEIGHTS)


def recipe_of(stage: str) -> Recipe:
    """The recipe a stage trains; a stage that trains none is an error naming the ones that do."""
    try:
        return BY_STAGE[stage]
    except KeyError:
        raise KeyError(f"{stage!r} trains no recipe; the recipes' stages: {', '.join(BY_STAGE)}") from None


# The recipe the convergence stage trains for longer and validates on the held-out split: the native one, the
# configuration a team would train with.
CONVERGENCE = recipe_of("train_native")
