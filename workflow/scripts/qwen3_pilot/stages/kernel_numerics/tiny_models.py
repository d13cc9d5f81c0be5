"""Tiny torchtitan Qwen3 models (dense and MoE) built from torchtitan's own builders, trained with and without
the kernel replacements on the same seed, weights and batches."""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from .comparison import seeded_generator

_log = logging.getLogger(__name__)


def tiny_titan_config(sizes: dict[str, int], seq_len: int, moe: bool):
    """torchtitan's own Qwen3 builders at toy sizes, with the recipes' decoder and SDPA attention (flex
    attention has no backward on CPU)."""
    from torchtitan.models.qwen3 import _build_qwen3_layers, _build_qwen3_moe_layers

    from qwen3_pilot.titan.api_levels import rope_config
    from qwen3_pilot.titan.models import qwen3_decoder, use_sdpa

    dim, head_dim = sizes["dim"], sizes["head_dim"]
    common = dict(
        n_layers=sizes["layers"], dim=dim, n_heads=sizes["heads"], n_kv_heads=sizes["kv_heads"], head_dim=head_dim,
        attn_backend="flex", rope=rope_config(dim=head_dim, length=seq_len, theta=1000000.0),
    )
    if moe:
        layers = _build_qwen3_moe_layers(
            **common, moe_hidden_dim=sizes["moe_hidden"], num_experts=sizes["experts"], top_k=sizes["top_k"],
            moe_comm_backend="standard",
        )
    else:
        layers = _build_qwen3_layers(**common, hidden_dim=sizes["hidden"])
    model = qwen3_decoder(dim=dim, vocab=sizes["vocab"], tied=False, layers=layers)
    use_sdpa(model)
    return model


def build_tiny_model(sizes: dict[str, int], seq_len: int, moe: bool, seed: int):
    import torch

    torch.manual_seed(seed)
    model = tiny_titan_config(sizes, seq_len, moe).build()
    model.init_states()
    return model


def kernel_rules(moe: bool) -> list[dict[str, str]]:
    """The rules the training stages configure: RoPE in every layer, and the experts of every MoE layer."""
    return [{"kernel": "rope_hf", "layers": "*"}] + ([{"kernel": "moe_grouped_experts", "layers": "*"}] if moe else [])


def replaced_model(
    sizes: dict[str, int], seq_len: int, moe: bool, reference,
    rope_apply: Callable | None = None, experts_impl: Callable | None = None,
):
    """The same tiny model built from its config after the kernel converters ran (as the trainer builds
    it), with `reference`'s weights; and {kernel: replaced module paths}. `rope_apply` / `experts_impl`
    swap the implementation under test (a test hands in a wrong one)."""
    from qwen3_pilot.titan.kernels.moe import KernelGroupedExperts
    from qwen3_pilot.titan.kernels.rope import HFLayoutRoPE
    from qwen3_pilot.titan.replacement import apply_converters, kernel_converters, replaced_paths

    config = apply_converters(tiny_titan_config(sizes, seq_len, moe), kernel_converters(kernel_rules(moe)))
    model = config.build()
    model.init_states()
    model.load_state_dict(reference.state_dict())
    for module in model.modules():
        if rope_apply is not None and isinstance(module, HFLayoutRoPE):
            module.apply_rope = rope_apply
        if experts_impl is not None and isinstance(module, KernelGroupedExperts):
            module.experts_impl = experts_impl
    return model, replaced_paths(config)


def token_batches(steps: int, batch: int, seq_len: int, vocab: int, seed: int):
    """(inputs, labels) per step: random tokens, labels the inputs shifted by one."""
    import torch

    generator = seeded_generator(seed + 1)
    tokens = torch.randint(0, vocab, (steps, batch, seq_len + 1), generator=generator)
    return [(step[:, :-1], step[:, 1:]) for step in tokens]


def train_losses(model, batches, lr: float) -> list[float]:
    import torch
    import torch.nn.functional as F

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    losses = []
    for inputs, labels in batches:
        logits = model(inputs)
        loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
        loss.backward()
        loss = loss.detach()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def replaced_model_trains(
    train: dict[str, Any], log: Callable[[str], None] | None = None, device: str = "cpu", **impls
) -> dict[str, Any]:
    """Per kind ("dense", "moe"): the same seed, weights and batches trained through torchtitan's modules
    and through the replacements; per-step losses of both and their largest difference. Also returns
    the replacement counts, and the built models for the compile check."""
    log = log or _log.info
    runs, counts, models = {}, {}, {}
    for kind in ("dense", "moe"):
        sizes = train[kind]
        reference = build_tiny_model(sizes, train["seq_len"], kind == "moe", train["seed"])
        replaced, paths = replaced_model(sizes, train["seq_len"], kind == "moe", reference, **impls)
        reference, replaced = reference.to(device), replaced.to(device)
        counts[kind] = {kernel: len(found) for kernel, found in paths.items()}
        models[kind] = copy.deepcopy(replaced)
        batches = [
            (inputs.to(device), labels.to(device))
            for inputs, labels in token_batches(
                train["steps"], train["batch"], train["seq_len"], sizes["vocab"], train["seed"]
            )
        ]
        started = time.perf_counter()
        reference_losses = train_losses(reference, batches, train["lr"])
        replaced_losses = train_losses(replaced, batches, train["lr"])
        runs[kind] = loss_comparison(reference_losses, replaced_losses)
        runs[kind]["seconds"] = round(time.perf_counter() - started, 2)
        log(f"{kind}: losses torchtitan {reference_losses} replaced {replaced_losses} "
            f"(max abs diff {runs[kind]['max_abs_loss_diff']:.3g})")
    return {"trains": runs, "replacement_counts": counts, "models": models}


def loss_comparison(reference: list[float], replaced: list[float]) -> dict[str, Any]:
    return {
        "losses_reference": reference,
        "losses_replaced": replaced,
        "max_abs_loss_diff": max(abs(a - b) for a, b in zip(reference, replaced, strict=True)),
        "finite": all(math.isfinite(x) for x in reference + replaced),
    }


def count_problems(counts: dict[str, dict[str, int]], train: dict[str, Any]) -> list[str]:
    """apply_rules already refuses a wrong count; this guards the figures that reach the report."""
    problems = []
    for kind, per_rule in counts.items():
        layers = train[kind]["layers"]
        for rule, count in per_rule.items():
            if count != layers:
                problems.append(
                    f"replacement_counts: {kind}: rule {rule} replaced {count} modules, model has {layers} layers"
                )
    return problems
