"""Stage compare_recipes: the two recipes' step-1 losses on the same weights and batch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..trainer_run import TrainingError


def run(
    *, hf_summary: Path, native_summary: Path, tolerance: float, backend: str, summary_path: Path
) -> dict[str, Any]:
    from ..stage_progress import record_measured
    from ..summary import StageSummary

    hf = json.loads(hf_summary.read_text())["figures"]["gate"]
    native = json.loads(native_summary.read_text())["figures"]["gate"]
    difference = abs(hf["step1_loss_loaded"] - native["step1_loss_loaded"])
    figures = {
        "step1_loss_train_hf": hf["step1_loss_loaded"],
        "step1_loss_train_native": native["step1_loss_loaded"],
        "abs_difference": difference,
        "tolerance": tolerance,
        "random_init_train_hf": hf["step1_loss_random_init"],
        "random_init_train_native": native["step1_loss_random_init"],
    }
    record_measured(**figures)
    if not difference <= tolerance:
        raise TrainingError(
            f"compare_recipes: step-1 losses differ by {difference:.6f} (train_hf {hf['step1_loss_loaded']:.6f}, "
            f"train_native {native['step1_loss_loaded']:.6f}); training.recipe_agreement_tolerance = {tolerance}"
        )
    summary = StageSummary(
        stage="compare_recipes",
        status="pass",
        backend=backend,
        figures=figures,
        proves=(
            f"On the same weights and first batch the Transformers-backend model and torchtitan's native Qwen3 "
            f"give the same step-1 loss within {tolerance} nats (difference {difference:.2e}): the native model, "
            "its weight conversion and its loss compute what the reference implementation computes."
        ),
        does_not_prove=(
            "That the recipes agree after the first optimizer step or in another dtype: they lay out parameters "
            "differently (fused QKV in the native model), so rounding differences can grow over steps. The "
            "random-init controls are expected to differ: each recipe has its own initialiser."
        ),
    )
    summary.add_artifacts([hf_summary, native_summary])
    return summary.write(summary_path)
