"""Stage `moe_reduced`: Qwen3-30B-A3B's architecture reduced to a few layers and experts, trained from
random init with torchtitan's trainer; per-step metrics, parameter counts and the router's load.

The training runs in torchrun's processes (recipes.qwen3_moe_reduced); this module launches and judges.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .parity import read_checkpoint_values
from .summary import record_measured
from .training import (
    CONFIG_FUNCTIONS,
    METRICS_FILE,
    PLAIN_RECIPE,
    TrainingError,
    launch_and_read,
    ranks_peak_flops,
    replaced_against_plain,
    replacement_proves,
    usable_backend,
    write_recipe,
)

ROUTER_LOAD_FILE = "router_load.jsonl"  # written by titan_metrics.recording_router_load, at the recipe's path
STAGE = "moe_reduced"


def model_spec(moe: dict[str, Any], width: dict[str, Any], vocab_size: int, max_seq_len: int) -> dict[str, Any]:
    """What recipes.reduced_moe_model builds: the layer/expert counts with one set of widths."""
    return {
        "layers": moe["layers"], "experts": moe["experts"], "top_k": moe["top_k"], "rope_theta": moe["rope_theta"],
        "max_seq_len": max_seq_len, "vocab_size": vocab_size, **width,
    }


def router_load(path: Path, tokens_per_step: int, top_k: int) -> tuple[dict[str, Any], list[str]]:
    """Tokens routed to each expert per layer, summed over the steps, with the max/mean ratio; every
    step must route each token to exactly top_k experts."""
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    if not records:
        return {}, [f"{path}: no router load was recorded"]
    problems = []
    layers = len(records[0]["tokens_per_expert"])
    totals = [[0.0] * len(records[0]["tokens_per_expert"][0]) for _ in range(layers)]
    for record in records:
        for layer, counts in enumerate(record["tokens_per_expert"]):
            if sum(counts) != tokens_per_step * top_k:
                problems.append(f"step {record['step']} layer {layer}: {sum(counts):.0f} routings, expected "
                                f"{tokens_per_step} tokens x top_k {top_k} = {tokens_per_step * top_k}")
            totals[layer] = [t + c for t, c in zip(totals[layer], counts)]
    per_layer = []
    for layer, counts in enumerate(totals):
        mean = sum(counts) / len(counts)
        per_layer.append({
            "layer": layer,
            "tokens_routed": int(sum(counts)),
            "max_over_mean": max(counts) / mean if mean else None,
            "experts_unused": sum(1 for c in counts if c == 0),
            "tokens_per_expert": [int(c) for c in counts],
        })
    return {"steps_recorded": len(records), "per_layer": per_layer}, problems


def moe_stage(
    *, backend_config: dict[str, Any], dataset: str, training: dict[str, Any], moe: dict[str, Any],
    kernels: dict[str, Any], cache_root: str, checkpoint_dir: Path, corpus_dir: Path, ranks_summary: Path,
    recipe_path: Path, run_dir: Path, plain_dir: Path, summary_path: Path, log_path: Path,
) -> dict[str, Any]:
    from .recipes import count_parameters, reduced_moe_model
    from .summary import StageSummary

    backend = usable_backend(STAGE, backend_config, cache_root)
    # The tokenizer comes with the fetched checkpoint, so the vocabulary does too.
    vocab_size = read_checkpoint_values(checkpoint_dir)["vocab_size"]
    trained_spec = model_spec(moe, moe["width"], vocab_size, training["seq_len"])
    full = moe["full_width"]
    full_spec = model_spec(moe, {k: v for k, v in full.items() if k not in ("vocab_size", "expected_params")},
                           full["vocab_size"], training["seq_len"])
    full_params = count_parameters(reduced_moe_model(full_spec))  # on the meta device: nothing allocated
    if full_params != full["expected_params"]:
        raise TrainingError(f"{STAGE}: the full-width reduced spec has {full_params:,} parameters; "
                            f"moe.full_width.expected_params = {full['expected_params']:,}")
    trained_params = count_parameters(reduced_moe_model(trained_spec))
    parity_path = recipe_path.with_name("parity.json")  # unused by this recipe; launch_failure looks for it
    recipe = write_recipe(
        recipe_path, stage=STAGE, backend=backend, checkpoint=checkpoint_dir, corpus_dir=corpus_dir, dataset=dataset,
        training=training, peak_flops_per_rank=ranks_peak_flops(ranks_summary), parity_path=parity_path,
        replacements=kernels["rules"], lnc=backend_config["neuron"]["lnc"],
        moe=trained_spec, router_load_path=str((run_dir / ROUTER_LOAD_FILE).resolve()),
    )
    run, steps = launch_and_read(
        STAGE, backend, config_function=CONFIG_FUNCTIONS[STAGE], recipe_path=recipe_path, run_dir=run_dir,
        log_path=log_path, parity_path=parity_path, expected_steps=training["steps"],
    )
    load, problems = router_load(run_dir / ROUTER_LOAD_FILE, training["global_batch_size"] * training["seq_len"],
                                 moe["top_k"])
    record_measured(steps=steps, router_load=load)
    if problems:
        raise TrainingError(f"{STAGE}: router load:\n  - " + "\n  - ".join(problems))
    # The plain run records its router load elsewhere: it must not add to this run's.
    recipe = {**recipe, "router_load_path": str((plain_dir / ROUTER_LOAD_FILE).resolve())}
    replacements = replaced_against_plain(
        STAGE, backend, config_function=CONFIG_FUNCTIONS[STAGE], recipe=recipe, recipe_path=recipe_path, run=run,
        steps=steps, plain_dir=plain_dir, log_path=log_path, parity_path=parity_path, kernels=kernels,
        n_layers=moe["layers"],
    )
    full_width_trained = trained_params == full_params
    summary = StageSummary(
        stage=STAGE,
        status="pass",
        backend=backend.name,
        figures={
            "model": trained_spec,
            "parameters": trained_params,
            "full_width_parameters": full_params,
            "full_width_trained": full_width_trained,
            "ranks": backend.expected_ranks,
            "parallelism": "FSDP over all ranks, tensor parallel 1, no expert parallelism, SDPA attention, eager",
            "steps_trained": len(steps),
            "first_loss": steps[0]["loss"],
            "final_loss": steps[-1]["loss"],
            "peak_memory_gib": max(s["peak_memory_gib"] for s in steps),
            "launch_wall_s": round(run.wall_s, 2),
            "router_load": load,
            "steps": steps,
            "kernel_replacements": replacements or f"none configured (kernels.{STAGE})",
        },
        notes=[
            "REDUCED MODEL: Qwen3-30B-A3B's architecture cut to "
            f"{moe['layers']} layers and {moe['experts']} experts (top-{moe['top_k']})"
            + ("" if full_width_trained else ", at tiny widths on this backend")
            + ", trained from random init. This is not a Qwen3-30B-A3B training result."
        ],
        proves=(
            f"torchtitan's trainer runs the Qwen3 MoE block (softmax top-{moe['top_k']} router, grouped experts, "
            f"load-balancing hook) for {len(steps)} steps with FSDP over {backend.expected_ranks} "
            f"{backend.dist_backend} ranks, every loss finite; every step routed each token to exactly "
            f"{moe['top_k']} experts in every layer; the full-width spec has {full_params:,} parameters."
            + replacement_proves(replacements)
        ),
        does_not_prove=(
            "Anything about training Qwen3-30B-A3B: 4 of 48 layers, 64 of 128 experts, random init, 10 steps. "
            "It does not exercise expert parallelism, and the router load after 10 steps from random init says "
            "nothing about the load of a trained router."
            + ("" if full_width_trained else " The widths trained here are tiny; only the parameter count was "
               "taken at full width.")
            + (" The experts' replacement runs torch._grouped_mm, as torchtitan's GroupedExperts does, on every "
               "backend: its loss agreement checks the replacement itself (config swap, shared weights, dtype), "
               "not a different kernel." if replacements and "moe_grouped_experts" in replacements["per_kernel"] else "")
        ),
    )
    plain = [recipe_path.with_name(PLAIN_RECIPE), plain_dir / METRICS_FILE] if replacements else []
    summary.add_artifacts([recipe_path, run_dir / METRICS_FILE, run_dir / ROUTER_LOAD_FILE, *plain])
    return summary.write(summary_path)
