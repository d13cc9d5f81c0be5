"""What every comparison of the stage records: the largest absolute difference between an implementation under
test and its reference, per op, dtype and shape. Measured here with no tolerance; judging.py holds each row to
the configured one."""

from __future__ import annotations

from typing import Any


def max_abs_diff(actual, expected) -> float:
    if actual.numel() == 0:
        return 0.0
    return float((actual.float() - expected.float()).abs().max())


def comparison_row(op: str, dtype: str, shape, actual, expected, **extra) -> dict[str, Any]:
    return {"op": op, "dtype": dtype, "shape": list(shape), "max_abs_diff": max_abs_diff(actual, expected), **extra}


def largest_per_dtype(rows: list[dict[str, Any]]) -> dict[str, float]:
    largest: dict[str, float] = {}
    for row in rows:
        largest[row["dtype"]] = max(largest.get(row["dtype"], 0.0), row["max_abs_diff"])
    return largest


def torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def seeded_generator(seed: int):
    import torch

    return torch.Generator().manual_seed(seed)
