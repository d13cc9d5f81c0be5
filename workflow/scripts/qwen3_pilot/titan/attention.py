"""SDPA for a torchtitan that folds the batch into the tokens (api_levels.GRAIN_FOLDED).

There upstream keeps `ScaledDotProductAttention` for Flux only: language models get flex or varlen attention with
per-document masks, and its SDPA takes (batch, seq, heads, head_dim) while attention hands over (tokens, heads,
head_dim). Flex attention has no backward on CPU and needs inductor and Triton, which Trainium has neither of;
varlen is a CUDA kernel. So the recipes keep their SDPA on that level too, through this module: the same causal
attention within each row of `row_length` tokens that SDPA computes on the other levels. Imports torch and
torchtitan: built inside the ranks (and by the stages that build the recipes' models).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torchtitan.models.common.attention import ScaledDotProductAttention


class RowCausalSDPA(ScaledDotProductAttention):
    """torchtitan's SDPA on (tokens, heads, head_dim): the tokens cut into rows of `row_length` (None: one row),
    each attended causally. Its arguments carry the folded names (q_TNH, k_TNH, v_TNH) that torchtitan's
    sharding config for an inner attention declares."""

    @dataclass(kw_only=True, slots=True)
    class Config(ScaledDotProductAttention.Config):
        row_length: int | None = None
        """The recipe's seq_len: the rows the other levels batch; None: the microbatch is one row."""

    def __init__(self, config: Config):
        super().__init__(config)
        self.row_length = config.row_length

    def forward(self, q_TNH: torch.Tensor, k_TNH: torch.Tensor, v_TNH: torch.Tensor, **kwargs) -> torch.Tensor:
        tokens = q_TNH.shape[0]
        row_length = self.row_length or tokens
        if tokens % row_length:
            raise ValueError(f"RowCausalSDPA: {tokens} tokens are not whole rows of row_length={row_length}")
        rows = [t.reshape(tokens // row_length, row_length, *t.shape[1:]) for t in (q_TNH, k_TNH, v_TNH)]
        out_BLNH = super().forward(*rows, **kwargs)
        return out_BLNH.reshape(tokens, *out_BLNH.shape[2:])
