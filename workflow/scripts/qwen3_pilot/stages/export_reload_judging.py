"""Rule judge for export_reload: each recipe's logits against torchtitan's, held to export_reload's tolerances.
Apart from what the stage measures with (stages/export_reload/), which never imports it: a
tolerance or wording edit here re-judges and reloads nothing (parse_time/code.py)."""

from __future__ import annotations

from typing import Any

from ..problems import problem_list
from .export_reload import RECIPES
from .export_reload.hf_export import ExportError


def logits_problems(recipe: str, logits: dict[str, Any], judging: dict[str, Any]) -> list[str]:
    """The judge's half: the reloaded model's logits against torchtitan's, held to export_reload's
    logits_tolerance and min_argmax_agreement (each recorded into `logits` beside its figure)."""
    logits["tolerance"], logits["min_argmax_agreement"] = judging["logits_tolerance"], judging["min_argmax_agreement"]
    problems = []
    if not logits["max_abs_diff"] <= judging["logits_tolerance"]:
        problems.append(f"{recipe}: reloaded logits differ from torchtitan's by {logits['max_abs_diff']:.3e} "
                        f"(export_reload.logits_tolerance = {judging['logits_tolerance']})")
    if not logits["argmax_agreement"] >= judging["min_argmax_agreement"]:
        problems.append(f"{recipe}: argmax agreement {logits['argmax_agreement']:.4f} below "
                        f"export_reload.min_argmax_agreement = {judging['min_argmax_agreement']}")
    return problems


def judge_export_reload(stage: str, figures: dict[str, Any], judging: dict[str, Any], backend: str) -> dict[str, str]:
    """Rule judge for export_reload: each recipe's logits against torchtitan's, held to the tolerances in
    `judging` (export_reload.logits_tolerance, min_argmax_agreement); returns proves and does_not_prove."""
    problems = [problem for recipe in RECIPES
                for problem in logits_problems(recipe, figures[recipe]["logits_vs_torchtitan"], judging)]
    if problems:
        raise ExportError(problem_list("export_reload failed", problems))
    return {
        "proves": (
            "Each recipe's last-step export, completed with the checkpoint's config and tokenizer files, loads "
            "with transformers' AutoModelForCausalLM from safetensors with no missing, unexpected or mismatched "
            "keys; tied embeddings share storage and no separate lm_head tensor is written; the reloaded "
            "model's logits on fixed random tokens match torchtitan's own Qwen3 loaded from the same files "
            "through its state-dict adapter; greedy generation runs; both exports hold the same tensors and "
            "dtypes, and they differ from the fetched weights."
        ),
        "does_not_prove": (
            "That the export equals the trainer's in-memory final state bit for bit: the comparison model is "
            "rebuilt from the export (it checks the HF format and torchtitan's conversion both ways, not the "
            "save path). The generated text is not judged for quality; the logits were compared on one fixed "
            "input in the export's dtype only."
        ),
    }
