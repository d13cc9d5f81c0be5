"""What every comparison of the stage records: the largest absolute difference between an implementation under
test and its reference, per op, dtype and shape. Measured here with no tolerance; judging.py holds each row to
the configured one."""

from __future__ import annotations

from typing import Any


def max_abs_diff(actual, expected) -> float:
    if actual.numel() == 0:
        return 0.0
    return float((actual.float() - expected.float()).abs().max())


def max_ulp_diff(actual, expected, dtype: str) -> float:
    """The largest difference in units in the last place of the reference's value in `dtype` (computed in
    float64): 0 is bit-identical, 1 is the next representable value. An ulp is the spacing of `dtype` at the
    reference (2^(exponent - 1) x eps), and at least the smallest subnormal step at and near zero."""
    import torch

    if actual.numel() == 0:
        return 0.0
    info = torch.finfo(torch_dtype(dtype))
    reference = expected.double()
    _, exponent = torch.frexp(reference)
    spacing = torch.ldexp(torch.full_like(reference, info.eps / 2), exponent)
    ulp = torch.clamp(spacing, min=info.smallest_normal * info.eps)
    return float(((actual.double() - reference).abs() / ulp).max())


def comparison_row(op: str, dtype: str, shape, actual, expected, **extra) -> dict[str, Any]:
    return {"op": op, "dtype": dtype, "shape": list(shape), "max_abs_diff": max_abs_diff(actual, expected),
            "max_ulp_diff": max_ulp_diff(actual, expected, dtype), **extra}


def largest_per_dtype(rows: list[dict[str, Any]], figure: str = "max_abs_diff") -> dict[str, float]:
    largest: dict[str, float] = {}
    for row in rows:
        largest[row["dtype"]] = max(largest.get(row["dtype"], 0.0), row[figure])
    return largest


def torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def seeded_generator(seed: int):
    import torch

    return torch.Generator().manual_seed(seed)
