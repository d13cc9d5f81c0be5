"""Stage export_reload: each recipe's Hugging Face export completed, reloaded with transformers and compared with
torchtitan. This job measures (measured.json) and fails on what no threshold decides (missing keys, an export
equal to the fetched weights, differing key sets); rule judge holds the logits to export_reload's tolerances
(judge_export_reload)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...problems import problem_list
from ...recipe_registry import FROM_FETCHED_WEIGHTS
from .hf_export import ExportError, check_export, key_set_problems, read_tensors

# Its name for each recipe trained from the fetched weights: the rule's inputs <name>, <name>_summary.
RECIPES = tuple(recipe.export for recipe in FROM_FETCHED_WEIGHTS)


def run(
    *, exports: dict[str, Path], checkpoint_dir: Path, out_root: Path, settings: dict[str, Any], seed: int,
    backend: str, measured_path: Path,
) -> dict[str, Any]:
    from ...stage_progress import record_measured
    from ...summary import StageMeasurement

    figures: dict[str, Any] = {}
    problems: list[str] = []
    artifacts: list[Path] = []
    completed = {}
    fetched = read_tensors(checkpoint_dir)  # once for both recipes: the full checkpoint on neuron
    for recipe, export_dir in exports.items():
        completed[recipe] = out_root / recipe
        recipe_figures, recipe_problems, files = check_export(
            recipe=recipe, export_dir=export_dir, checkpoint_dir=checkpoint_dir, out_dir=completed[recipe],
            settings=settings, seed=seed, fetched=fetched,
        )
        figures[recipe] = recipe_figures
        problems += recipe_problems
        artifacts += files
    figures["recipes_agree"], agreement_problems = key_set_problems(completed)
    problems += agreement_problems
    record_measured(**figures, problems=problems)
    if problems:
        raise ExportError(problem_list("export_reload failed", problems))
    measurement = StageMeasurement(stage="export_reload", backend=backend, figures=figures)
    measurement.add_artifacts(artifacts)
    return measurement.write(measured_path)


