"""The grouped-matmul MoE experts (and torchtitan's own GroupedExperts) against a per-expert loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .comparison import comparison_row, seeded_generator, torch_dtype

MOE_OPS = ("moe_forward", "moe_grad_x", "moe_grad_w1", "moe_grad_w2", "moe_grad_w3")


def moe_numerics(
    shapes: list[dict[str, int]],
    dtypes: list[str],
    grouped_impl: Callable | None = None,
    include_torchtitan: bool = True,
    seed: int = 0,
    device: str = "cpu",
) -> list[dict[str, Any]]:
    """`grouped_impl` (default: the grouped matmul) against the per-expert loop in each dtype, forward
    output and gradients of x, w1, w2, w3; and, in bfloat16, torchtitan's own `GroupedExperts` too (it
    computes in bfloat16 whatever its inputs are, so a float32 row of it would measure rounding)."""
    from qwen3_pilot.titan.kernels.moe import grouped_experts_swiglu, looped_experts_swiglu, torchtitan_grouped_experts

    grouped_impl = grouped_impl or grouped_experts_swiglu
    rows = []
    for shape in shapes:
        for dtype in dtypes:
            compute_dtype = torch_dtype(dtype)
            inputs = [t.to(device) for t in _moe_inputs(shape, compute_dtype, seed)]
            expected = _experts_forward_backward(looped_experts_swiglu, compute_dtype, *inputs)
            candidates = [(_impl_name(grouped_impl), grouped_impl)]
            if include_torchtitan and dtype == "bfloat16":
                candidates.append(("torchtitan.GroupedExperts", torchtitan_grouped_experts))
            for impl_name, impl in candidates:
                actual = _experts_forward_backward(impl, compute_dtype, *inputs)
                for op, got, want in zip(MOE_OPS, actual, expected, strict=True):
                    rows.append(comparison_row(op, dtype, want.shape, got, want,
                                               impl=impl_name, reference="looped_experts_swiglu"))
    return rows


def _impl_name(impl: Callable) -> str:
    return getattr(impl, "__name__", type(impl).__name__)


def _moe_inputs(shape: dict[str, int], dtype, seed: int):
    """Expert-sorted tokens and per-expert counts; the last expert gets no token, so an empty group is
    always exercised. Weights scaled by fan-in so outputs and gradients stay near unit size in every
    shape, which keeps one absolute tolerance meaningful across shapes."""
    import torch

    generator = seeded_generator(seed)
    tokens, dim, hidden, experts = shape["tokens"], shape["dim"], shape["hidden"], shape["experts"]
    expert_ids = torch.randint(0, max(experts - 1, 1), (tokens,), generator=generator)
    counts = torch.bincount(expert_ids, minlength=experts)
    x = torch.randn(tokens, dim, generator=generator).to(dtype)
    w1 = (torch.randn(experts, hidden, dim, generator=generator) * dim**-0.5).to(dtype)
    w2 = (torch.randn(experts, dim, hidden, generator=generator) * hidden**-0.5).to(dtype)
    w3 = (torch.randn(experts, hidden, dim, generator=generator) * dim**-0.5).to(dtype)
    grad_out = (torch.randn(tokens, dim, generator=generator) * tokens**-0.5).to(dtype)
    return x, counts, w1, w2, w3, grad_out


def _experts_forward_backward(impl: Callable, compute_dtype, x, counts, w1, w2, w3, grad_out):
    leaves = [t.clone().requires_grad_() for t in (x, w1, w2, w3)]
    x_, w1_, w2_, w3_ = leaves
    out = impl(x_, counts, w1_, w2_, w3_, compute_dtype=compute_dtype)
    out.backward(grad_out)
    return (out.detach(), *(leaf.grad for leaf in leaves))
