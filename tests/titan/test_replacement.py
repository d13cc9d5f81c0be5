"""The kernel replacement registry as a torchtitan ModelConfigConverter on the real Qwen3 configs: what it
replaces before the model is built, the one log line per replaced module, and each way a rule is refused
(a layer with no match, a layer with two, a wrong type, a rule applied twice)."""

from __future__ import annotations

import copy
import sys

import pytest
import torch
from conftest import default_config

from qwen3_pilot.stages.kernel_numerics import tiny_models
from qwen3_pilot.titan.kernels import parse_replacement_lines, replacement_log_problems
from qwen3_pilot.titan.kernels.moe import KernelGroupedExperts
from qwen3_pilot.titan.kernels.rope import HFLayoutRoPE
from qwen3_pilot.titan.replacement import (
    ReplacementError,
    apply_converters,
    kernel_converters,
    replaced_paths,
)

SEQ_LEN = 256
DENSE = default_config()["kernel_numerics"]["train"]["dense"]
MOE = default_config()["kernel_numerics"]["train"]["moe"]


@pytest.fixture
def dense_config():
    return tiny_models.tiny_titan_config(DENSE, SEQ_LEN, moe=False)


@pytest.fixture
def moe_config():
    return tiny_models.tiny_titan_config(MOE, SEQ_LEN, moe=True)


def convert(config, *rules):
    return apply_converters(config, kernel_converters(list(rules)))


def test_rope_rule_replaces_the_config_of_every_layer_and_the_model_computes_the_same(dense_config, capfd):
    reference = tiny_models.build_tiny_model(DENSE, SEQ_LEN, moe=False, seed=0)
    converted = convert(copy.deepcopy(dense_config), {"kernel": "rope_hf"})
    assert replaced_paths(converted) == {"rope_hf": [f"layers.{i}.attention.rope" for i in range(DENSE["layers"])]}
    assert all(isinstance(layer.attention.rope, HFLayoutRoPE.Config) for layer in converted.layers)

    model = converted.build()
    model.init_states()  # torchtitan's own init rebuilds the replaced module's cos/sin cache
    model.load_state_dict(reference.state_dict())
    tokens = torch.randint(0, DENSE["vocab"], (1, SEQ_LEN))
    assert torch.equal(model(tokens), reference(tokens))
    assert isinstance(model.get_submodule("layers.0.attention.rope"), HFLayoutRoPE)
    lines = parse_replacement_lines(capfd.readouterr().out)
    assert [(line["kernel"], line["path"], line["source"], line["target"]) for line in lines] == [
        ("rope_hf", f"layers.{i}.attention.rope", "CosSinRoPE", "HFLayoutRoPE") for i in range(DENSE["layers"])
    ]


def test_moe_rules_keep_the_state_dict(moe_config):
    reference = tiny_models.build_tiny_model(MOE, SEQ_LEN, moe=True, seed=0)
    model = convert(moe_config, {"kernel": "rope_hf"}, {"kernel": "moe_grouped_experts"}).build()
    assert set(model.state_dict()) == set(reference.state_dict())
    assert isinstance(model.get_submodule("layers.0.moe.routed_experts.inner_experts"), KernelGroupedExperts)


def test_a_layers_pattern_narrows_the_rule(dense_config):
    converted = convert(dense_config, {"kernel": "rope_hf", "layers": "1"})
    assert replaced_paths(converted) == {"rope_hf": ["layers.1.attention.rope"]}
    assert not isinstance(converted.layers[0].attention.rope, HFLayoutRoPE.Config)


def test_a_layer_without_a_match_is_named(dense_config):
    with pytest.raises(ReplacementError, match=r"no module matches in layer\(s\) 0, 1"):
        convert(dense_config, {"kernel": "moe_grouped_experts"})  # a dense model has no experts


def test_two_matches_in_a_layer_are_named(moe_config):
    # "moe.*experts*" catches routed_experts and the inner_experts inside it.
    with pytest.raises(ReplacementError, match=r"2 modules match in layer 0: layers\.0\.moe\.routed_experts, "
                                               r"layers\.0\.moe\.routed_experts\.inner_experts"):
        convert(moe_config, {"kernel": "moe_grouped_experts", "module": "moe.*experts*"})


def test_a_module_of_the_wrong_type_is_refused(dense_config):
    with pytest.raises(ReplacementError, match=r"not a CosSinRoPE\.Config: layers\.0\.attention\.qk_norm"):
        convert(dense_config, {"kernel": "rope_hf", "module": "attention.qk_norm"})


def test_a_layers_pattern_that_selects_nothing_is_refused(dense_config):
    with pytest.raises(ReplacementError, match="selects none of the model's 2 layers"):
        convert(dense_config, {"kernel": "rope_hf", "layers": "9"})


def test_a_rule_applied_twice_is_refused_and_a_refused_rule_changes_nothing(dense_config):
    with pytest.raises(ReplacementError, match=r"already replaced: layers\.0\.attention\.rope \(by rope_hf\)"):
        convert(dense_config, {"kernel": "rope_hf"}, {"kernel": "rope_hf"})
    fresh = tiny_models.tiny_titan_config(DENSE, SEQ_LEN, moe=False)
    with pytest.raises(ReplacementError):
        convert(fresh, {"kernel": "rope_hf", "module": "attention.*"})
    assert replaced_paths(fresh) == {}


def test_an_unknown_kernel_is_refused(dense_config):
    with pytest.raises(ValueError, match="kernel 'nki_rope': unknown; known kernels: moe_grouped_experts, rope_hf"):
        convert(dense_config, {"kernel": "nki_rope"})


def test_a_kernel_without_its_classes_is_refused_rather_than_checked_against_another_kernels():
    from qwen3_pilot.titan.replacement import _source_and_target

    assert _source_and_target("moe_grouped_experts")[1].__name__ == "KernelGroupedExperts"
    with pytest.raises(ValueError, match=r"kernel 'rms_norm': no source and target classes"):
        _source_and_target("rms_norm")


# ---- the launch-log check the training stages run (torch-free) ----


def log_of(*paths, kernel="rope_hf"):
    return "\n".join(
        f"[rank0]: kernel replacement: {kernel} {path} CosSinRoPE -> HFLayoutRoPE [PyTorch]" for path in paths
    )


RULE = [{"kernel": "rope_hf", "layers": "*"}]


def test_the_log_check_passes_one_line_per_layer():
    lines = parse_replacement_lines(log_of("layers.0.attention.rope", "layers.1.attention.rope"))
    assert lines[1]["layer"] == "1" and lines[1]["impl"] == "PyTorch"
    assert replacement_log_problems(lines, RULE, n_layers=2) == []


def test_the_log_check_names_layers_with_none_and_with_two():
    text = log_of("layers.0.attention.rope", "layers.0.attention.rope", "layers.2.attention.rope")
    assert replacement_log_problems(parse_replacement_lines(text), RULE, n_layers=4) == [
        "rope_hf: no replacement logged in layer(s) 1, 3 (expected one in each of layers 0, 1, 2, 3)",
        "rope_hf: 2 replacements logged in layer 0: layers.0.attention.rope, layers.0.attention.rope",
    ]


def test_the_log_check_names_layers_outside_the_rule_and_unconfigured_kernels():
    text = log_of("layers.0.attention.rope", "layers.1.attention.rope") + "\n" + log_of(
        "layers.0.moe.routed_experts.inner_experts", kernel="moe_grouped_experts"
    )
    problems = replacement_log_problems(parse_replacement_lines(text), [{"kernel": "rope_hf", "layers": "0"}], 2)
    assert problems == [
        "rope_hf: replacements logged in layer(s) 1, outside the rule's layers '0'",
        "replacements logged for kernel(s) moe_grouped_experts, which this run did not configure",
    ]


def test_the_log_line_keeps_an_implementation_with_brackets_whole():
    from qwen3_pilot.backends.neuron.in_process import NEURON_EXPERTS_IMPLEMENTATION

    nki = ("NKI: nkilib.core.embeddings.rope_hf.rope_hf[2] on 2 logical core(s) per rank, registered with "
           "torch_neuronx.nki_op")
    text = (f"[default0]:kernel replacement: rope_hf layers.0.attention.rope CosSinRoPE -> HFLayoutRoPE [{nki}]\n"
            f"kernel replacement: moe_grouped_experts layers.0.moe.routed_experts.inner_experts GroupedExperts -> "
            f"KernelGroupedExperts [{NEURON_EXPERTS_IMPLEMENTATION}]\r\n")
    assert [line["impl"] for line in parse_replacement_lines(text)] == [nki, NEURON_EXPERTS_IMPLEMENTATION]


def test_no_lines_fail_every_configured_kernel():
    assert replacement_log_problems([], RULE, n_layers=2) == [
        "rope_hf: no replacement logged in layer(s) 0, 1 (expected one in each of layers 0, 1)"
    ]


def test_a_replacement_line_reaches_stdout_in_one_write_with_its_newline(monkeypatch):
    """Unbuffered (torchrun's ranks), print's text and newline are two writes, and another rank's warning once landed
    between them, glued to the line's end: the launch log's count then missed that layer."""
    import types

    from qwen3_pilot.titan import kernels

    writes = []
    monkeypatch.setattr(sys, "stdout", types.SimpleNamespace(write=writes.append, flush=lambda: None))
    monkeypatch.setenv("RANK", "0")
    config = types.SimpleNamespace(kernel="rope_hf", module_path="layers.0.attention.rope")
    kernels.log_replacement(config, "HFLayoutRoPE")
    assert len(writes) == 1 and writes[0].endswith("]\n")
    assert kernels.parse_replacement_lines(writes[0] + "/x.py:311: UserWarning: DTensor\n")[0]["layer"] == "0"
