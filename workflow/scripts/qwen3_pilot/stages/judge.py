"""Rule judge: a measuring stage's figures (its measured.json) held to the configured thresholds, into the
stage's summary.json: the training stages (stages/train.py, stages/moe_reduced.py), export_reload,
kernel_numerics and the benchmark. Apart from measuring, so that an edit to a gate threshold, a tolerance or an
accepted difference's reason re-judges the recorded figures in a second instead of training or measuring again
(on a trn2: a compile and a run per stage)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..artifacts import describe_artifact
from ..stage_progress import record_measured
from ..summary import StageSummary
from ..titan.parity import with_reasons
from ..training import TrainingError, loaded_weights_gate, replaced_against_plain, replacement_proves
from .benchmark import judge_benchmark
from .export_reload import judge_export_reload
from .kernel_numerics.judging import judge_kernel_numerics


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
    return summary.write(summary_path)


def judge_recipe(stage: str, figures: dict[str, Any], judging: dict[str, Any], backend: str) -> dict[str, str]:
    """train_hf and train_native: the loaded-weights gate, the parity table's reasons, and the kernel replacements
    against the plain run. Fills `figures` with the judged figures; returns proves and does_not_prove."""
    loaded, control = figures["steps"], figures["control_steps"]
    gate, problems = loaded_weights_gate(loaded[0]["loss"], control[0]["loss"], figures["vocab_size"],
                                         judging["gate"])
    figures["gate"] = gate
    if problems:
        raise TrainingError(f"{stage}: loaded-weights gate failed:\n  - " + "\n  - ".join(problems))
    figures["parity"] = with_reasons(figures["parity"], judging["accepted_differences"])
    replacements = figures["kernel_replacements"] = replaced_against_plain(
        stage, loaded, figures["kernel_replacements"], judging.get("loss_tolerance"))
    cpu = backend == "cpu"
    return {
        "proves": (
            f"torchtitan's trainer ran {len(loaded)} steps of this recipe with FSDP over {figures['ranks']} "
            f"{figures['dist_backend']} ranks from the fetched weights, every loss finite, and wrote a Hugging Face "
            f"safetensors export. Its step-1 loss ({gate['step1_loss_loaded']:.4f}) is {gate['gap']:.2f} nats below "
            f"a random-init control on the same batch ({gate['step1_loss_random_init']:.4f}; ln vocab "
            f"{gate['ln_vocab']:.2f}): the weights loaded. The model matches config.json on every parity field "
            "(or on an accepted difference, listed with its reason)."
            + replacement_proves(replacements)
        ),
        "does_not_prove": (
            f"That training improves the model: {len(loaded)} steps on a small corpus say nothing about convergence, "
            "and a loss falling over them can be memorisation of a few batches. MFU is against "
            + ("a measured CPU matmul peak, not an accelerator's peak; " if cpu else "the published peak; ")
            + "throughput here predicts nothing about another backend."
            + (" These were tiny models on CPU ranks, not Qwen3-4B on a trn2." if cpu else "")
        ),
    }


def judge_moe_reduced(stage: str, figures: dict[str, Any], judging: dict[str, Any], backend: str) -> dict[str, str]:
    """The reduced MoE: its kernel replacements against the plain run (its router load and parameter counts were
    checked as they were measured: they have no configured threshold)."""
    steps, model, published = figures["steps"], figures["model"], figures["published_model"]
    replacements = figures["kernel_replacements"] = replaced_against_plain(
        stage, steps, figures["kernel_replacements"], judging.get("loss_tolerance"))
    return {
        "proves": (
            f"torchtitan's trainer runs the Qwen3 MoE block (softmax top-{model['top_k']} router, grouped experts, "
            f"load-balancing hook) for {len(steps)} steps with FSDP over {figures['ranks']} "
            f"{figures['dist_backend']} ranks, every loss finite; every step routed each token to exactly "
            f"{model['top_k']} experts in every layer; the full-width spec has {figures['full_width_parameters']:,} "
            "parameters."
            + replacement_proves(replacements)
        ),
        "does_not_prove": (
            f"Anything about training Qwen3-30B-A3B: {model['layers']} of {published['layers']} layers, "
            f"{model['experts']} of {published['experts']} experts, random init, {len(steps)} steps. It does "
            f"not exercise expert parallelism, and the router load after {len(steps)} steps from random init says "
            "nothing about the load of a trained router."
            + ("" if figures["full_width_trained"] else " The widths trained here are tiny; only the parameter count "
               "was taken at full width.")
            + (" The experts' replacement runs torch._grouped_mm, as torchtitan's GroupedExperts does, on every "
               "backend: its loss agreement checks the replacement itself (config swap, shared weights, dtype), "
               "not a different kernel." if not isinstance(replacements, str)
               and "moe_grouped_experts" in replacements["per_kernel"] else "")
        ),
    }


JUDGES = {"train_hf": judge_recipe, "train_native": judge_recipe, "moe_reduced": judge_moe_reduced,
          "export_reload": judge_export_reload, "kernel_numerics": judge_kernel_numerics,
          "benchmark": judge_benchmark}
