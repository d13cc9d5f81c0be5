"""The reduced Qwen3 MoE (Qwen3-30B-A3B's architecture at a few layers and experts) that stage moe_reduced
trains: its spec, and the router's load read back from the run (stages/moe_reduced.py launches it).

The training runs in torchrun's processes (titan/in_ranks/recipes.py: qwen3_moe_reduced).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

STAGE = "moe_reduced"


def model_spec(moe: dict[str, Any], width: dict[str, Any], vocab_size: int, max_seq_len: int) -> dict[str, Any]:
    """What models.reduced_moe_model builds: the layer/expert counts with one set of widths."""
    return {
        "layers": moe["layers"], "experts": moe["experts"], "top_k": moe["top_k"], "rope_theta": moe["rope_theta"],
        "max_seq_len": max_seq_len, "vocab_size": vocab_size, **width,
    }


def reduced_moe_changes(spec: dict[str, Any], router_load_path: Path) -> dict[str, Any]:
    """What the reduced MoE's run sets in a TrainerRun: random init (there are no reduced weights to load), the
    model spec, and where its router load goes. Used by stage moe_reduced, the benchmark and the preflight."""
    return {"use_checkpoint": False, "moe": spec, "router_load_path": str(Path(router_load_path).resolve())}


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
            totals[layer] = [t + c for t, c in zip(totals[layer], counts, strict=True)]
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
