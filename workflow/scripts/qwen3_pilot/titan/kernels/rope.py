"""RoPE as a custom op with the NKI Library `rope_hf` kernel's contract, and the module that puts it in
place of torchtitan's RoPE.

Where RoPE lives in torchtitan 0.3.0: `GQAttention.forward` calls `self.rope(xq, xk, positions)`, and
`self.rope` is a `CosSinRoPE` module for every Qwen3 flavor (`torchtitan/models/common/rope.py`). That
per-layer module ("layers.<i>.attention.rope") is the smallest thing that owns RoPE, so it is what gets
replaced. Its cache is `[cos | sin]` of shape (max_seq_len, 2 x head_dim), built from
`theta = cat(freqs, freqs)`, and `apply_rotary_emb` uses rotate_half (`cat(-x2, x1)`): the HF
convention, the same one the NKI kernel implements ("y = [x1, x2] * cos + [-x2, x1] * sin"). So the
cache's two halves are the kernel's cos and sin as they are; only the q/k layout differs.

The op's contract (`qwen3_pilot::rope_hf`), that of the NKI Library's rope_hf kernel (backends/neuron/nki_rope.py):
  q (batch, q_heads, seq, head_dim), k (batch, kv_heads, seq, head_dim): HF layout, contiguous;
  cos, sin (seq, head_dim) or (batch, seq, head_dim);
  backward=False: (q * cos + rotate_half(q) * sin, same for k);
  backward=True: the gradient of that map, g * cos + rotate_half_T(g * sin) with rotate_half_T(u) = [u2, -u1].
  A backend's kernel may take only some sequence lengths; it says so itself (backends/<backend>).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torchtitan.models.common.rope import CosSinRoPE

from qwen3_pilot.titan.kernels import ReplacedConfig, log_replacement

OP_NAME = "qwen3_pilot::rope_hf"


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_half_transposed(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x2, -x1), dim=-1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backward: bool) -> torch.Tensor:
    # cos/sin (seq, H) or (batch, seq, H) against x (batch, heads, seq, H): add the heads axis.
    cos, sin = cos.unsqueeze(-3).float(), sin.unsqueeze(-3).float()
    # float32 inside, like torchtitan's CosSinRoPE (query.float()), so bf16 inputs round once, at the end.
    x = x.float()
    return x * cos + (rotate_half_transposed(x * sin) if backward else rotate_half(x) * sin)


@torch.library.custom_op(OP_NAME, mutates_args=())
def rope_hf(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backward: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """CPU (and any device without its own kernel): the HF-layout contract in plain PyTorch. Outputs are
    fresh tensors, allocated here as the NKI kernel's destination-passing call needs them allocated by
    its caller (a functional custom op cannot return a caller's buffer)."""
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    q_out.copy_(_rotate(q, cos, sin, backward))
    k_out.copy_(_rotate(k, cos, sin, backward))
    return q_out, k_out


@rope_hf.register_fake
def _rope_hf_fake(q, k, cos, sin, backward):
    return torch.empty_like(q), torch.empty_like(k)


def rope_hf_setup_context(ctx, inputs, output):
    _, _, cos, sin, backward = inputs
    ctx.save_for_backward(cos, sin)
    ctx.backward = backward


def backward_through(op) -> Callable:
    """The op's autograd backward, computed by the op itself: the rotation is linear in q and k, so its gradient
    is the kernel's own backward mode on the same saved cos/sin (and the gradient of that is the forward mode
    again). cos/sin get no gradient: they are the fixed table."""

    def backward(ctx, grad_q, grad_k):
        cos, sin = ctx.saved_tensors
        grad_q, grad_k = op(grad_q.contiguous(), grad_k.contiguous(), cos, sin, not ctx.backward)
        return grad_q, grad_k, None, None, None

    return backward


rope_hf.register_autograd(backward_through(rope_hf), setup_context=rope_hf_setup_context)

# The op the RoPE module calls: the plain custom op above, unless a backend has put its kernel's op in its place
# (backends/neuron/nki_rope.py). A module global rather than a dispatch key, so that a compiled graph holds the
# backend's own op (torch.compile reads the global and guards on it).
_rope_op = rope_hf


def use_rope_op(op) -> None:
    global _rope_op
    _rope_op = op


def rope_titan_layout(
    q_BLNH: torch.Tensor, k_BLNH: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """torchtitan's (batch, seq, heads, head_dim) in and out, the kernel's (batch, heads, seq, head_dim)
    in between."""
    # The kernel walks HBM with fixed strides, so it needs the HF layout materialised, not a view.
    q_BNLH = q_BLNH.transpose(1, 2).contiguous()
    k_BNLH = k_BLNH.transpose(1, 2).contiguous()
    q_out, k_out = _rope_op(q_BNLH, k_BNLH, cos, sin, False)
    # Views back to (B, L, N, H): torchtitan's SDPA transposes to (B, N, L, H) again, which makes these
    # contiguous there, so no copy on the way out.
    return q_out.transpose(1, 2), k_out.transpose(1, 2)


RopeApply = Callable[..., tuple[torch.Tensor, torch.Tensor]]


class HFLayoutRoPE(CosSinRoPE):
    """torchtitan's `CosSinRoPE` (same config, same [cos | sin] cache, same call:
    `(query, key, positions) -> (query, key)`) that rotates through `qwen3_pilot::rope_hf` instead of
    torchtitan's own arithmetic. Built from the config that `replacement.KernelReplacement` puts in place
    of a layer's `CosSinRoPE.Config`, so the model is built with it from the start; the cache is a
    non-persistent buffer, so the state dict does not change."""

    @dataclass(kw_only=True, slots=True)
    class Config(CosSinRoPE.Config, ReplacedConfig):
        kernel: str = "rope_hf"
        module_path: str = ""

    def __init__(self, config: Config):
        super().__init__(config)
        # A test hands in a wrong rotation here to see the checks fail.
        self.apply_rope: RopeApply = rope_titan_layout
        log_replacement(config, type(self).__name__)

    def forward(self, query: torch.Tensor, key: torch.Tensor, positions: torch.Tensor | None = None):
        cos, sin = self.cos_sin(query, positions)
        if query.dim() == 3:  # a torchtitan with the batch folded into the tokens: (tokens, heads, head_dim)
            query_out, key_out = self.apply_rope(query.unsqueeze(0), key.unsqueeze(0), cos, sin)
            return query_out.squeeze(0), key_out.squeeze(0)
        return self.apply_rope(query, key, cos, sin)

    def cos_sin(self, query: torch.Tensor, positions: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(seq, head_dim) each, or (batch, seq, head_dim) for per-sample positions: torchtitan's own cache
        lookup (positions, bounds check), without its broadcast heads axis ((tokens, 1, 2 x head_dim) where
        the batch is folded into the tokens, (1 or batch, seq, 1, 2 x head_dim) otherwise)."""
        head_dim = query.shape[-1]
        if self.cache.shape[-1] != 2 * head_dim:
            raise ValueError(
                f"HFLayoutRoPE: cache width {self.cache.shape[-1]} is not 2 x head_dim = {2 * head_dim}; "
                "only a CosSinRoPE [cos | sin] cache has the kernel's layout"
            )
        rows = self._reshape_cache(query, positions).squeeze(-2)
        if rows.dim() == 3 and rows.shape[0] == 1:
            rows = rows[0]
        return rows[..., :head_dim], rows[..., head_dim:]
