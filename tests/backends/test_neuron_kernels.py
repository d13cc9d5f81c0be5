"""The neuron kernel path on CPU, against fake Neuron packages: how the rope_hf op launches an `@nki.jit`
kernel (grid, buffers, table dtype and layout, what it returns) and install_kernels' success branch in a fresh
interpreter (it registers a kernel process-wide). The fake kernel computes no RoPE: it writes a marker
derived from its inputs, so these tests prove the calls, not the real kernel's arithmetic (kernel_numerics
checks that on a trn2; tests/titan/test_rope.py checks the cpu implementation against a hand-computed RoPE)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from qwen3_pilot.backends.neuron import nki_rope
from qwen3_pilot.backends.neuron.kernel_limits import SeqLenRuleError

LNC = 2
SEQ = 128 * LNC
# What the fake kernel writes: no rotation at all, so a result that carries it came from the kernel's launch.
MARK = 1000.0


class FakeNkiKernel:
    """An `@nki.jit` kernel as TorchNeuron launches it, `kernel[grid](q, k, q_out, k_out, cos=, sin=,
    backward=)`: records each launch and writes q + MARK, k - MARK into the caller's buffers, or with
    `returns_results` leaves them untouched and returns fresh tensors of its own (recorded as "returned")."""

    def __init__(self, returns_results: bool = False):
        self.returns_results = returns_results
        self.launches: list[dict] = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            record = {"grid": grid, "args": args, "kwargs": kwargs}
            self.launches.append(record)
            q, k, q_out, k_out = args
            if self.returns_results:
                record["returned"] = (q + MARK, k - MARK)
                return record["returned"]
            q_out.copy_(q + MARK)
            k_out.copy_(k - MARK)
            return None

        return launch


def rope_inputs(dtype=torch.float32, seq=SEQ, head_dim=16):
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, seq, head_dim, generator=generator).to(dtype)
    k = torch.randn(2, 2, seq, head_dim, generator=generator).to(dtype)
    angles = torch.rand(seq, head_dim // 2, generator=generator) * 6.3
    # float32 and not contiguous (a transposed copy), as a table slice may arrive.
    cos = torch.cat([angles.cos()] * 2, -1).t().contiguous().t()
    sin = torch.cat([angles.sin()] * 2, -1).t().contiguous().t()
    return q, k, cos, sin


@pytest.mark.fake_neuron
@pytest.mark.parametrize("backward", [False, True])
def test_call_shape_the_nki_rope_is_launched_on_lnc_cores_into_fresh_buffers_it_returns(backward):
    kernel = FakeNkiKernel()
    q, k, cos, sin = rope_inputs()
    assert not cos.is_contiguous()
    q_out, k_out = nki_rope.nki_rope_kernel(kernel, LNC)(q, k, cos, sin, backward)
    (launch,) = kernel.launches
    assert launch["grid"] == LNC
    launched_q, launched_k, buffer_q, buffer_k = launch["args"]
    assert launched_q is q and launched_k is k
    assert buffer_q is q_out and buffer_k is k_out  # the results are the buffers the kernel wrote
    assert buffer_q.shape == q.shape and buffer_k.shape == k.shape
    assert set(launch["kwargs"]) == {"cos", "sin", "backward"} and launch["kwargs"]["backward"] is backward
    # The tables as given (cos as cos, sin as sin), only made contiguous.
    assert torch.equal(launch["kwargs"]["cos"], cos) and torch.equal(launch["kwargs"]["sin"], sin)
    assert launch["kwargs"]["cos"].is_contiguous() and launch["kwargs"]["sin"].is_contiguous()
    # What the kernel wrote, and nothing else, is what the op returns.
    assert torch.equal(q_out, q + MARK) and torch.equal(k_out, k - MARK)


@pytest.mark.fake_neuron
def test_call_shape_the_nki_rope_gets_cos_and_sin_in_the_dtype_of_q_and_contiguous():
    kernel = FakeNkiKernel()
    q, k, cos, sin = rope_inputs(torch.bfloat16)
    nki_rope.nki_rope_kernel(kernel, LNC)(q, k, cos, sin, False)
    launched = kernel.launches[0]["kwargs"]
    for name, given in (("cos", cos), ("sin", sin)):
        table = launched[name]
        assert table.dtype == torch.bfloat16 and table.is_contiguous(), name
        assert torch.equal(table, given.bfloat16()), name  # the same table, rounded to q's dtype


@pytest.mark.fake_neuron
def test_call_shape_the_nki_rope_returns_what_the_kernel_returns_when_it_hands_back_tensors():
    kernel = FakeNkiKernel(returns_results=True)
    q, k, cos, sin = rope_inputs()
    q_out, k_out = nki_rope.nki_rope_kernel(kernel, LNC)(q, k, cos, sin, False)
    (launch,) = kernel.launches
    _, _, buffer_q, buffer_k = launch["args"]
    returned_q, returned_k = launch["returned"]
    assert q_out is returned_q and k_out is returned_k  # never the untouched buffers
    assert q_out is not buffer_q and k_out is not buffer_k


@pytest.mark.fake_neuron
def test_call_shape_the_nki_rope_refuses_a_seq_len_off_the_kernel_grid_before_launching():
    kernel = FakeNkiKernel()
    q, k, cos, sin = rope_inputs(seq=128)
    with pytest.raises(SeqLenRuleError, match=r"seq_len=128 is not a multiple of 128 x LNC = 128 x 2"):
        nki_rope.nki_rope_kernel(kernel, LNC)(q, k, cos, sin, False)
    assert kernel.launches == []


# What the real packages do that install_kernels relies on: torch_neuronx names the PrivateUse1 device "neuron" (as
# importing it registers the device) and has `nki_op(name, mutates_args=...)`, which registers a function with type
# hints as a custom op (this fake: through torch.library.custom_op, which infers the schema from those hints, so a
# wrapper without them fails here as it would there) and records the registration; nkilib has the rope_hf kernel
# object, here one that records each launch and writes q + MARK, k - MARK into the buffers it is handed.
FAKE_PACKAGES = {
    "torch_neuronx/__init__.py": (
        "import torch\ntorch.utils.rename_privateuse1_backend('neuron')\nREGISTERED = []\n\n"
        "def nki_op(name, fn=None, mutates_args={}):\n"
        "    def register(fn):\n"
        "        REGISTERED.append({'name': name, 'mutates_args': sorted(mutates_args)})\n"
        "        return torch.library.custom_op(name, fn, mutates_args=mutates_args)\n"
        "    return register if fn is None else register(fn)\n"
    ),
    "nkilib/__init__.py": "",
    "nkilib/core/__init__.py": "",
    "nkilib/core/embeddings/__init__.py": "",
    "nkilib/core/embeddings/rope_hf.py": (
        "LAUNCHES = []\n\nclass _Kernel:\n    def __getitem__(self, grid):\n"
        "        def launch(q, k, q_out, k_out, cos, sin, backward):\n"
        "            LAUNCHES.append({'grid': grid, 'backward': backward})\n"
        f"            q_out.copy_(q + {MARK}); k_out.copy_(k - {MARK})\n"
        "        return launch\n\n"
        "rope_hf = _Kernel()\n"
    ),
}
INSTALL = """
import json, torch, torch_neuronx
from nkilib.core.embeddings.rope_hf import LAUNCHES
from qwen3_pilot.titan.kernels import rope  # defines the plain op, with its cpu implementation only
from qwen3_pilot.backends.neuron.in_process import install_kernels
before = hasattr(torch.ops.qwen3_pilot, "rope_hf_nki")
implementations = install_kernels({"NEURON_LOGICAL_NC_CONFIG": "2"})  # as the backend's launch sets it
module = rope.HFLayoutRoPE(rope.HFLayoutRoPE.Config(dim=16, max_seq_len=512))
q = torch.zeros(1, 256, 4, 16, requires_grad=True)
k = torch.zeros(1, 256, 2, 16, requires_grad=True)
q_out, k_out = module(q, k)
(q_out.sum() + k_out.sum()).backward()
# kernel_numerics' check of the backend's rule, through the module and the installed kernel as on a trn2.
from qwen3_pilot.backends.neuron.kernel_limits import kernel_limits
from qwen3_pilot.stages.kernel_numerics.rope_checks import seq_len_rule_check
rule_check = seq_len_rule_check(kernel_limits({"neuron": {"lnc": 2}})["rope_hf"])
print(json.dumps({"before": before, "after": hasattr(torch.ops.qwen3_pilot, "rope_hf_nki"),
                  "registered": torch_neuronx.REGISTERED, "launches": LAUNCHES, "implementations": implementations,
                  "q_out": sorted(set(q_out.flatten().tolist())), "k_out": sorted(set(k_out.flatten().tolist())),
                  "q_grad": sorted(set(q.grad.flatten().tolist())), "rule": rule_check}))
"""


@pytest.mark.fake_neuron
def test_call_shape_install_kernels_registers_the_nki_rope_through_nki_op_and_the_rope_module_calls_it(tmp_path):
    """install_kernels registers the kernel the way AWS documents for TorchNeuron (torch_neuronx.nki_op, its
    backward through register_autograd), and the replaced RoPE module then runs it forward and backward, the
    plain op not at all (its rotation of zeros would be zeros, and the kernel's marker would be missing)."""
    for name, text in FAKE_PACKAGES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    for key in ("TORCH_NEURONX_NEFF_CACHE_DIR", "TORCH_NEURONX_DEBUG_DIR"):
        env.pop(key, None)
    result = subprocess.run([sys.executable, "-c", INSTALL], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["before"] is False and seen["after"] is True
    assert seen["registered"] == [{"name": "qwen3_pilot::rope_hf_nki", "mutates_args": []}]
    # The forward on 2 logical cores, then the backward: the same kernel in its backward mode.
    assert seen["launches"][:2] == [{"grid": 2, "backward": False}, {"grid": 2, "backward": True}]
    assert seen["q_out"] == [MARK] and seen["k_out"] == [-MARK]
    assert seen["q_grad"] == [1.0 + MARK]  # the kernel's backward of a gradient of ones
    assert seen["implementations"]["rope_hf"] == (
        "NKI: nkilib.core.embeddings.rope_hf.rope_hf[2] on 2 logical core(s) per rank, registered with "
        "torch_neuronx.nki_op")
    assert seen["implementations"]["moe_grouped_experts"].startswith("torch._grouped_mm on the neuron device")
    # The rule fires in the installed kernel, before a launch: 384 = 3 x 128 is no multiple of 128 x LNC 2.
    rule = seen["rule"]
    assert rule["verdict"] == "pass" and rule["required_multiple"] == 256
    assert rule["good"] == {"seq_len": 256, "raised": False, "error": None}
    assert rule["bad"]["seq_len"] == 384 and "is not a multiple of 128 x LNC = 128 x 2" in rule["bad"]["error"]
    assert seen["launches"][2:] == [{"grid": 2, "backward": False}]  # the good length's forward only


def test_the_kernels_refuse_to_install_without_the_runtimes_lnc():
    from qwen3_pilot.backends.neuron.in_process import runtime_lnc

    assert runtime_lnc({"NEURON_LOGICAL_NC_CONFIG": "1"}) == 1
    with pytest.raises(RuntimeError, match=r"NEURON_LOGICAL_NC_CONFIG='': the neuron kernels launch on the runtime"):
        runtime_lnc({})
