"""Rule judge: a measuring stage's figures (its measured.json) held to the configured thresholds, into the
stage's summary.json: verify_ranks, the training stages (stages/train.py, stages/moe_reduced.py), convergence,
export_reload, kernel_numerics and the benchmark. Apart from measuring, so that an edit to a gate threshold, a
tolerance, a floor or an accepted difference's reason re-judges the recorded figures in a second instead of training
or measuring again (on a trn2: a compile and a run per stage)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..artifacts import describe_artifact
from ..stage_progress import record_measured
from ..summary import StageSummary
from .benchmark_judging import judge_benchmark
from .convergence_judging import judge_convergence
from .export_reload_judging import judge_export_reload
from .kernel_numerics.judging import judge_kernel_numerics
from .moe_reduced_judging import judge_moe_reduced
from .train_judging import judge_recipe
from .verify_ranks_judging import judge_verify_ranks


def run(*, stage: str, judging: dict[str, Any], measured_path: Path, summary_path: Path) -> dict[str, Any]:
    measured = json.loads(measured_path.read_text())
    figures = dict(measured["figures"])
    try:
        verdict = JUDGES[stage](stage, figures, judging, measured["backend"])
    finally:
        # A failed judgment's record keeps every measured figure, with what the judge filled in or added up
        # to its failure (a tolerance and verdict per row, the gate).
        record_measured(**figures)
    notes = [*measured["notes"], *verdict.pop("notes", [])]
    summary = StageSummary(
        stage=stage, status="pass", backend=measured["backend"], figures=figures, notes=notes,
        # The work's own span: judging takes a moment and is not what the report times.
        started=measured["started"], ended=measured["ended"],
        artifacts=[*measured["artifacts"], describe_artifact(measured_path)], **verdict,
    )
    # The judge's own code, and the code that measured (a judge edit re-judges figures measured by older code).
    summary.code = {**summary.code, "measured": measured.get("code", {})}
    return summary.write(summary_path)


JUDGES = {"verify_ranks": judge_verify_ranks, "train_hf": judge_recipe, "train_native": judge_recipe,
          "convergence": judge_convergence, "moe_reduced": judge_moe_reduced, "export_reload": judge_export_reload,
          "kernel_numerics": judge_kernel_numerics, "benchmark": judge_benchmark}
