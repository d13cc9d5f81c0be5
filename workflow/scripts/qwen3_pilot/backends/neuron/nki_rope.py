"""The NKI Library's `rope_hf` kernel as the `qwen3_pilot::rope_hf` op's implementation on a trn2: launched on the
configured logical cores, registered as a PyTorch custom op through torch_neuronx's `nki_op`, and put in place of
the plain op (titan/kernels/rope.py) for eager mode and compiled graphs alike. Imported only where the neuron
backend installs its kernels (in_process.install_kernels); the kernel and `nki_op` are handed in, so that the
tests drive these functions on CPU with fakes."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...titan.kernels.rope import backward_through, rope_hf_setup_context, use_rope_op
from .kernel_limits import check_seq_len

NKI_OP_NAME = "qwen3_pilot::rope_hf_nki"


def register_neuron_kernel(lnc: int) -> None:
    """Puts the NKI Library kernel in place of the plain op, for eager mode and compiled graphs alike. Call once
    per process on a trn2 with the Neuron SDK, before the model runs; never called on the build machines.

    Module name: `nkilib.core.embeddings.rope_hf.rope_hf`, the NKI Library kernel (module `nkilib`; the
    distribution that provides it is recorded by pin_env as system version `nkilib`; source:
    github.com/aws-neuron/nki-library, src/nkilib_src/nkilib/core/embeddings/rope_hf.py)."""
    from nkilib.core.embeddings.rope_hf import rope_hf as nki_rope_hf
    from torch_neuronx import nki_op

    use_rope_op(nki_rope_op(nki_op, nki_rope_hf, lnc))


def nki_rope_op(nki_op, nki_rope_hf, lnc: int):
    """`qwen3_pilot::rope_hf_nki`: the kernel launch (nki_rope_kernel) registered as a PyTorch custom op the way
    AWS documents it for TorchNeuron, which is what takes an NKI kernel into torch.compile(backend="neuron"):
    `nki_op` from torch_neuronx ("from torch_neuronx import nki_op, nki", then `@nki_op("mylib::my_op",
    mutates_args={})` on a wrapper with type hints that calls the `@nki.jit` kernel:
    https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/get-started/about/index.html), its backward added
    with `register_autograd` on the op it returns ("Training models that include NKI kernels requires a backward
    version of the custom op, implemented using the register_autograd() function":
    https://awsdocs-neuron.readthedocs-hosted.com/en/latest/frameworks/torch/pytorch-native-overview.html). In
    torch.compile the kernel call "becomes one node in the captured graph and compiles together with the
    surrounding PyTorch operations" (.../torch/guides/how-to-work-with-nki.html); Neuron SDK 2.33 or later
    (.../torch/get-started/quickstart-nki-kernel.html). AWS's pages say nothing of a plain custom op whose
    neuron kernel launches NKI, which is why that route is gone. Outputs are fresh tensors (mutates_args empty):
    the buffers the kernel writes are allocated inside the wrapper."""
    launch = nki_rope_kernel(nki_rope_hf, lnc)

    def rope_hf_nki(
        q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backward: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return launch(q, k, cos, sin, backward)

    op = nki_op(NKI_OP_NAME, mutates_args={})(rope_hf_nki)
    op.register_autograd(backward_through(op), setup_context=rope_hf_setup_context)
    return op


def nki_rope_kernel(nki_rope_hf, lnc: int) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The `rope_hf` op's implementation through the `@nki.jit` kernel `nki_rope_hf`, launched on `lnc`
    logical cores by subscripting it with the grid size (`kernel[lnc](...)`, DESIGN.md's Neuron facts); the
    kernel reads its shard id from the launch grid."""

    def rope_hf_neuron(q, k, cos, sin, backward):
        check_seq_len(q.shape[2], lnc)
        q_out, k_out = torch.empty_like(q), torch.empty_like(k)
        # The kernel loads cos/sin tiles in q's dtype and addresses HBM with fixed strides.
        cos, sin = cos.to(q.dtype).contiguous(), sin.to(q.dtype).contiguous()
        returned = nki_rope_hf[lnc](q, k, q_out, k_out, cos=cos, sin=sin, backward=backward)
        # The kernel writes into the buffers it is handed; should the jit wrapper hand back tensors of its
        # own instead, those are the results (never the untouched buffers).
        if returned is not None:
            q_out, k_out = returned
        return q_out, k_out

    return rope_hf_neuron
