"""Kernel-backed replacements for torchtitan Qwen3 modules, checked by the `kernel_numerics` stage.

- `rope`: RoPE as the custom op `qwen3_pilot::rope_hf` (HF layout, own autograd); on neuron the NKI
  Library's `rope_hf` kernel, on cpu plain PyTorch of the same contract. `HFLayoutRoPE` takes the place
  of each attention layer's `CosSinRoPE`.
- `moe`: the routed experts' grouped matmul (`torch._grouped_mm`, as torchtitan's `GroupedExperts`)
  and the per-expert loop it is checked against.

The submodules import torch and torchtitan; import them in the stage process only.
"""
