"""The NKI kernels' shape rules on a trn2, torch-free: the config is held to them at parse time
(backends/neuron config_problems), the kernel checks every call before it launches (nki_rope.py), and
kernel_numerics shows the rule firing through the installed kernel. No other backend has such a rule."""

from __future__ import annotations

from typing import Any

# The NKI Library's rope_hf kernel tiles the sequence in blocks of 128 rows per logical core.
NKI_ROPE_TILE = 128


class SeqLenRuleError(ValueError):
    pass


def required_seq_multiple(lnc: int) -> int:
    return NKI_ROPE_TILE * lnc


def check_seq_len(seq_len: int, lnc: int) -> None:
    """The NKI rope_hf kernel's sequence rule, before a launch that would otherwise fail inside the kernel."""
    multiple = required_seq_multiple(lnc)
    if seq_len % multiple:
        raise SeqLenRuleError(
            f"rope_hf: seq_len={seq_len} is not a multiple of {NKI_ROPE_TILE} x LNC = {NKI_ROPE_TILE} x {lnc} "
            f"= {multiple}; the NKI rope_hf kernel splits the sequence across the {lnc} logical core(s) in "
            f"blocks of {NKI_ROPE_TILE} rows (set training.seq_len to a multiple of {multiple})"
        )


def kernel_limits(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per kernel, the sequence length it takes (a multiple of `seq_multiple`) at the configured LNC and why, for
    kernel_numerics' check and the report."""
    lnc = config["neuron"]["lnc"]
    multiple = required_seq_multiple(lnc)
    return {"rope_hf": {
        "seq_multiple": multiple,
        # At LNC > 1 the telling bad case is a multiple of 128 that is not one of 128 x LNC: a check of the
        # tile alone would let it through.
        "bad_seq_len": multiple + (NKI_ROPE_TILE if lnc > 1 else NKI_ROPE_TILE // 2),
        "why": f"the NKI rope_hf kernel tiles the sequence in blocks of {NKI_ROPE_TILE} rows per logical core "
               f"({NKI_ROPE_TILE} x LNC {lnc})",
    }}
