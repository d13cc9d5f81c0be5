"""Rule judge for moe_reduced: its kernel replacements' losses against the plain run, held to
kernels.loss_tolerance (its router load and parameter counts were checked as they were measured: they have no
configured threshold). Apart from what the stage measures with, which never imports it (parse_time/code.py)."""

from __future__ import annotations

from typing import Any

from .train_judging import replaced_against_plain, replacement_proves


def judge_moe_reduced(stage: str, figures: dict[str, Any], judging: dict[str, Any], backend: str) -> dict[str, str]:
    """The reduced MoE judged (see the module's docstring); fills `figures`, returns proves and does_not_prove."""
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
