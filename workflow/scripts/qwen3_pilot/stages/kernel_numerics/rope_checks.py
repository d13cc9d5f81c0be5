"""The RoPE replacement against torchtitan's own RoPE, and the NKI kernel's sequence-length rule firing."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .comparison import comparison_row, seeded_generator, torch_dtype

ROPE_OPS = ("rope_forward_q", "rope_forward_k", "rope_grad_q", "rope_grad_k")


def rope_numerics(
    shapes: list[dict[str, int]],
    dtypes: list[str],
    rope_apply: Callable | None = None,
    theta: float = 1000000.0,
    seed: int = 0,
    device: str = "cpu",
) -> list[dict[str, Any]]:
    """`HFLayoutRoPE` around `rope_apply` (default: the `qwen3_pilot::rope_hf` op in torchtitan layout, i.e.
    the backend's kernel) against torchtitan's `CosSinRoPE`, forward outputs and input gradients for q and
    k, on `device`. Each row also records the inputs' largest magnitude, which a "bf16_stepwise" tolerance is
    derived from (bf16_stepwise_rope_bound)."""
    from torchtitan.models.common.rope import CosSinRoPE

    from qwen3_pilot.titan.api_levels import rope_config
    from qwen3_pilot.titan.kernels.rope import HFLayoutRoPE, rope_titan_layout

    rows = []
    for shape in shapes:
        rope_args = {"dim": shape["head_dim"], "length": shape["seq"], "theta": theta}
        reference = CosSinRoPE(rope_config(**rope_args)).to(device)
        replaced = HFLayoutRoPE(rope_config(**rope_args, config_class=HFLayoutRoPE.Config)).to(device)
        replaced.apply_rope = rope_apply or rope_titan_layout
        for dtype in dtypes:
            inputs = [t.to(device) for t in _rope_inputs(shape, torch_dtype(dtype), seed)]
            expected = _rope_forward_backward(reference, *inputs)
            actual = _rope_forward_backward(replaced, *inputs)
            max_abs_input = max(float(t.abs().max()) for t in inputs)
            for op, got, want in zip(ROPE_OPS, actual, expected, strict=True):
                rows.append(comparison_row(op, dtype, want.shape, got, want, max_abs_input=max_abs_input))
    return rows


BF16_UNIT_ROUNDOFF = 2.0**-8  # half an ulp of 1.0 in bfloat16 (8 significant bits)


def bf16_stepwise_rope_bound(max_abs_input: float) -> float:
    """How far a RoPE that rounds to bfloat16 at each step (as the NKI rope_hf kernel does: cos/sin loaded in
    q's dtype, then q*cos, rotate_half(q)*sin and their sum each rounded) may be from one that computes in
    float32 and rounds once (torchtitan's CosSinRoPE), for inputs up to `max_abs_input` = M. With u the unit
    roundoff: cos and sin rounded, 2uM over both products; each product rounded, uM each; the sum and the
    reference's own final rounding, u x sqrt(2)M each (|q cos + r sin| <= sqrt(2)M). In all
    (4 + 2 sqrt(2)) u M, about 0.027 M: a worst case, not an expected difference."""
    return (4 + 2 * math.sqrt(2)) * BF16_UNIT_ROUNDOFF * max_abs_input


def _rope_inputs(shape: dict[str, int], dtype, seed: int):
    import torch

    generator = seeded_generator(seed)
    batch, seq, head_dim = shape["batch"], shape["seq"], shape["head_dim"]

    def sample(heads):
        return torch.randn(batch, seq, heads, head_dim, generator=generator).to(dtype)

    q, k = sample(shape["heads"]), sample(shape["kv_heads"])
    grad_q, grad_k = sample(shape["heads"]), sample(shape["kv_heads"])
    return q, k, grad_q, grad_k


def _rope_forward_backward(rope, q, k, grad_q, grad_k):
    import torch

    q, k = q.clone().requires_grad_(), k.clone().requires_grad_()
    q_out, k_out = rope(q, k)
    torch.autograd.backward((q_out, k_out), (grad_q, grad_k))
    return q_out.detach(), k_out.detach(), q.grad, k.grad


def seq_len_rule_check(rule: dict[str, Any] | None, device: str = "cpu") -> dict[str, Any]:
    """The backend's sequence rule for rope_hf (its `kernel_limits`) firing through the installed kernel on `device`:
    the RoPE module at a conforming length must pass, at `rule["bad_seq_len"]` it must raise before any launch. A
    backend whose kernel takes every length (cpu) has no rule to check."""
    if rule is None:
        return {"applies": False, "verdict": "pass"}
    outcomes = {}
    for label, seq_len in (("good", rule["seq_multiple"]), ("bad", rule["bad_seq_len"])):
        try:
            _rope_at(seq_len, device)
            outcomes[label] = {"seq_len": seq_len, "raised": False, "error": None}
        except ValueError as error:  # the rule's own error is one (backends/neuron/kernel_limits.py)
            outcomes[label] = {"seq_len": seq_len, "raised": True, "error": str(error)}
    passed = not outcomes["good"]["raised"] and outcomes["bad"]["raised"]
    return {"applies": True, "rule": rule["why"], "required_multiple": rule["seq_multiple"], **outcomes,
            "verdict": "pass" if passed else "fail"}


def _rope_at(seq_len: int, device: str) -> None:
    import torch

    from qwen3_pilot.titan.api_levels import rope_config
    from qwen3_pilot.titan.kernels.rope import HFLayoutRoPE

    head_dim = 8
    rope = HFLayoutRoPE(rope_config(dim=head_dim, length=seq_len, config_class=HFLayoutRoPE.Config)).to(device)
    x = torch.zeros(1, seq_len, 1, head_dim, device=device)
    rope(x, x)


def seq_len_rule_problems(check: dict[str, Any]) -> list[str]:
    problems = []
    if not check["applies"]:
        return problems
    if check["good"]["raised"]:
        problems.append(f"seq_len_rule: seq_len={check['good']['seq_len']} conforms but raised: "
                        f"{check['good']['error']}")
    if not check["bad"]["raised"]:
        problems.append(
            f"seq_len_rule: seq_len={check['bad']['seq_len']} is not a multiple of {check['required_multiple']} "
            f"({check['rule']}) but did not raise"
        )
    return problems
