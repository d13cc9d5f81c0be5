"""The routed experts' computation: SwiGLU experts over tokens already sorted by expert.

torchtitan 0.3.0's `GroupedExperts.forward` (torchtitan/models/common/moe.py) runs all experts as three
`torch._grouped_mm` calls over the expert-sorted tokens, with cumulative per-expert token counts as
group offsets, always in bfloat16. It has no per-expert loop any more, so the loop reference is here:
one plain matmul chain per expert over its slice of the tokens, which is what the grouped matmul must
equal. `grouped_experts_swiglu` is torchtitan's grouped computation with the compute dtype as a
parameter (float32 shows the grouping itself is exact; bfloat16 is what torchtitan runs);
`torchtitan_grouped_experts` runs torchtitan's own module, unchanged.

Shapes (torchtitan's suffixes): x_RD (routed tokens, dim), num_tokens_per_expert_E (experts,),
w1_EFD / w3_EFD (experts, hidden, dim), w2_EDF (experts, dim, hidden).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torchtitan.models.common.moe import GroupedExperts

from qwen3_pilot.titan.kernels import ReplacedConfig, log_replacement

ExpertsImpl = Callable[..., torch.Tensor]


def grouped_experts_swiglu(
    x_RD: torch.Tensor,
    num_tokens_per_expert_E: torch.Tensor,
    w1_EFD: torch.Tensor,
    w2_EDF: torch.Tensor,
    w3_EFD: torch.Tensor,
    compute_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    offsets_E = torch.cumsum(num_tokens_per_expert_E, dim=0, dtype=torch.int32)

    def grouped(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch._grouped_mm(a.to(compute_dtype), w.to(compute_dtype).transpose(-2, -1), offs=offsets_E)

    # x is cast once per projection, as torchtitan does: the two gradients then meet in x's own dtype.
    # One shared cast would add them in compute_dtype first (bfloat16), which shows as loss drift.
    h_RF = F.silu(grouped(x_RD, w1_EFD)) * grouped(x_RD, w3_EFD)
    return grouped(h_RF, w2_EDF).type_as(x_RD)


def looped_experts_swiglu(
    x_RD: torch.Tensor,
    num_tokens_per_expert_E: torch.Tensor,
    w1_EFD: torch.Tensor,
    w2_EDF: torch.Tensor,
    w3_EFD: torch.Tensor,
    compute_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """The reference: each expert on its own contiguous slice of the sorted tokens."""
    counts = [int(c) for c in num_tokens_per_expert_E.tolist()]
    outputs = []
    for expert, x_e in enumerate(x_RD.split(counts)):
        w1, w2, w3 = (w[expert].to(compute_dtype) for w in (w1_EFD, w2_EDF, w3_EFD))
        # One cast per projection, so x's two gradients add up in x's dtype (see grouped_experts_swiglu).
        h = F.silu(x_e.to(compute_dtype) @ w1.T) * (x_e.to(compute_dtype) @ w3.T)
        outputs.append(h @ w2.T)
    return torch.cat(outputs).type_as(x_RD)


def torchtitan_grouped_experts(
    x_RD: torch.Tensor,
    num_tokens_per_expert_E: torch.Tensor,
    w1_EFD: torch.Tensor,
    w2_EDF: torch.Tensor,
    w3_EFD: torch.Tensor,
    compute_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """torchtitan's own `GroupedExperts.forward` on these weights (it computes in bfloat16 whatever
    `compute_dtype` says)."""
    experts, hidden, dim = w1_EFD.shape
    with torch.device("meta"):
        module = GroupedExperts(GroupedExperts.Config(dim=dim, hidden_dim=hidden, num_experts=experts))
    _share_expert_weights(module, w1_EFD, w2_EDF, w3_EFD)
    return module(x_RD, num_tokens_per_expert_E)


def _share_expert_weights(module, w1_EFD, w2_EDF, w3_EFD) -> None:
    for name, weight in (("w1_EFD", w1_EFD), ("w2_EDF", w2_EDF), ("w3_EFD", w3_EFD)):
        if isinstance(weight, torch.nn.Parameter):
            setattr(module, name, weight)
        else:
            # A plain tensor (a test's leaf): keep autograd flowing to it rather than to a copy.
            del module._parameters[name]
            setattr(module, name, weight)


class KernelGroupedExperts(GroupedExperts):
    """torchtitan's `GroupedExperts` (same config, same Parameters: the state dict keys, the optimizer and
    a checkpoint see no difference) that computes through `experts_impl`. Built from the config that
    `replacement.KernelReplacement` puts in place of a MoE layer's `GroupedExperts.Config`."""

    @dataclass(kw_only=True, slots=True)
    class Config(GroupedExperts.Config, ReplacedConfig):
        kernel: str = "moe_grouped_experts"
        module_path: str = ""
        compute_dtype: str = "bfloat16"
        """torchtitan's GroupedExperts computes in bfloat16 whatever its inputs are; so does this."""

    def __init__(self, config: Config):
        super().__init__(config)
        self.compute_dtype = getattr(torch, config.compute_dtype)
        # A test hands in a wrong implementation here to see the checks fail.
        self.experts_impl: ExpertsImpl = grouped_experts_swiglu
        log_replacement(config, type(self).__name__)

    def forward(self, x_RD: torch.Tensor, num_tokens_per_expert_E: torch.Tensor) -> torch.Tensor:
        weights = [w.to_local() if hasattr(w, "to_local") else w for w in (self.w1_EFD, self.w2_EDF, self.w3_EFD)]
        return self.experts_impl(x_RD, num_tokens_per_expert_E, *weights, compute_dtype=self.compute_dtype)
