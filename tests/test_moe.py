"""moe_reduced's torch-free checks: the router load table and its routing-count rule."""

from __future__ import annotations

import json

import pytest
import yaml

from qwen3_pilot.reduced_moe import router_load


def write_load(path, steps):
    path.write_text("".join(json.dumps({"step": i + 1, "tokens_per_expert": layers}) + "\n"
                            for i, layers in enumerate(steps)))
    return path


def test_router_load_sums_steps_per_layer_with_the_max_over_mean(tmp_path):
    path = write_load(tmp_path / "load.jsonl", [[[3, 1, 0, 0], [1, 1, 1, 1]], [[1, 1, 0, 2], [2, 0, 1, 1]]])
    load, problems = router_load(path, tokens_per_step=2, top_k=2)
    assert problems == []
    first, second = load["per_layer"]
    assert first["tokens_per_expert"] == [4, 2, 0, 2] and first["tokens_routed"] == 8
    assert first["max_over_mean"] == pytest.approx(2.0) and first["experts_unused"] == 1
    assert second["max_over_mean"] == pytest.approx(1.5) and load["steps_recorded"] == 2


def test_router_load_names_a_step_that_routed_the_wrong_number_of_tokens(tmp_path):
    path = write_load(tmp_path / "load.jsonl", [[[4, 4, 0, 0]]])  # counted twice, as under recomputation
    _, problems = router_load(path, tokens_per_step=2, top_k=2)
    assert problems == ["step 1 layer 0: 8 routings, expected 2 tokens x top_k 2 = 4"]


def test_no_router_load_is_a_problem(tmp_path):
    assert router_load(tmp_path / "missing.jsonl", 2, 2)[1] == [
        f"{tmp_path / 'missing.jsonl'}: no router load was recorded"]


def test_the_full_width_reduced_spec_has_the_published_parameter_count():
    from qwen3_pilot.reduced_moe import model_spec
    from qwen3_pilot.titan.models import count_parameters, reduced_moe_model

    moe = {"layers": 4, "experts": 64, "top_k": 4, "rope_theta": 1e6}
    width = {"dim": 2048, "n_heads": 32, "n_kv_heads": 4, "head_dim": 128, "moe_hidden_dim": 768}
    assert count_parameters(reduced_moe_model(model_spec(moe, width, 151936, 4096))) == 1_906_330_624
    assert count_parameters(reduced_moe_model(model_spec({**moe, "experts": 128}, width, 151936, 4096))) > 1_906_330_624


def test_kernel_numerics_on_neuron_fails_at_once_naming_the_missing_packages(tmp_path, monkeypatch):
    """No not_run path on the target: without the Neuron packages the stage stops before measuring anything,
    having given its own process the environment the ranks get for the device first."""
    from conftest import PROJECT, backend_config

    from qwen3_pilot.stages.kernel_numerics import run as kernel_numerics

    device_vars = ("TORCH_NEURONX_NEFF_CACHE_DIR", "TORCH_NEURONX_DEBUG_DIR", "NEURON_LOGICAL_NC_CONFIG",
                   "NEURON_RT_VIRTUAL_CORE_SIZE")
    for key in device_vars:
        # Also makes monkeypatch restore each afterwards; a folder, as the stage may create it.
        monkeypatch.setenv(key, str(tmp_path / "left over from before"))
    for key in ("FI_PROVIDER", "OMP_NUM_THREADS", "SLURM_JOB_NODELIST", "SLURM_JOB_NUM_NODES"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("NEURON_CC_FLAGS", "--the-user's-own")
    neuron = yaml.safe_load((PROJECT / "config" / "trn2.yaml").read_text())["neuron"]
    with pytest.raises(ImportError) as raised:
        kernel_numerics(
            backend_config=backend_config("neuron", 64, neuron=neuron, nodes=2), settings={},
            cache_root=str(tmp_path), measured_path=tmp_path / "measured.json",
        )
    assert "torch_neuronx (torch-neuronx" in str(raised.value)
    assert "nkilib.core.embeddings.rope_hf (the NKI Library" in str(raised.value)
    assert not (tmp_path / "measured.json").exists()
    import os

    assert {key: os.environ[key] for key in device_vars} == {
        "TORCH_NEURONX_NEFF_CACHE_DIR": f"{tmp_path.resolve()}/neuron/neff-cache",
        "TORCH_NEURONX_DEBUG_DIR": f"{tmp_path.resolve()}/neuron/debug",
        "NEURON_LOGICAL_NC_CONFIG": "2", "NEURON_RT_VIRTUAL_CORE_SIZE": "2",
    }
    # Nothing of the ranks' launch: no EFA settings even with nodes = 2, no thread count; the user's flags kept,
    # the configured LNC after them for the compiler.
    assert "FI_PROVIDER" not in os.environ and "OMP_NUM_THREADS" not in os.environ
    assert os.environ["NEURON_CC_FLAGS"] == "--the-user's-own --lnc=2"


def test_the_trn2_numerics_settings_hold_float32_to_2_ulps_and_derive_the_bfloat16_bound():
    from conftest import PROJECT, default_config

    from qwen3_pilot.stages.kernel_numerics.rope_checks import bf16_stepwise_rope_bound

    trn2 = default_config(yaml.safe_load((PROJECT / "config" / "trn2.yaml").read_text()))["kernel_numerics"]
    assert trn2["rope"]["tolerances"] == {"float32": {"ulps": 2}, "bfloat16": "bf16_stepwise"}
    assert (trn2["compile"]["models"] == []
            and trn2["rope"]["shapes"] == default_config()["kernel_numerics"]["rope"]["shapes"])
    # (4 + 2 sqrt 2) x 2^-8 x M: about 0.027 M; for unit-normal inputs that reach 5, about 0.13.
    assert bf16_stepwise_rope_bound(5.0) == pytest.approx(0.1334, abs=1e-4)
