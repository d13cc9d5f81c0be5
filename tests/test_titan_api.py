"""The torchtitan API check: the installed torchtitan 0.3.0 has every name the project uses, and a
torchtitan without one of them is refused with the name, why the project needs it and since when."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import types

import pytest

from qwen3_pilot.titan_api import TORCHTITAN_API, ApiEntry, TorchtitanApiError, check_torchtitan_api, missing_api

FAKE = "fake_torchtitan_config"


@pytest.fixture
def fake_titan(monkeypatch):
    """A module shaped like torchtitan.config in a fork from before 2026-08-13: TrainingConfig without
    disable_cuda_graphs, a builder without `converters`, a class whose __init__ sets no MFU peak."""
    module = types.ModuleType(FAKE)

    @dataclasses.dataclass
    class TrainingConfig:
        local_batch_size: int = 8
        seq_len: int = 2048

    def model_registry(flavor: str):
        return flavor

    class MetricsProcessor:
        def __init__(self):
            self.logger = None

    module.TrainingConfig, module.model_registry = TrainingConfig, model_registry
    module.MetricsProcessor = MetricsProcessor
    monkeypatch.setitem(sys.modules, FAKE, module)
    return module


def test_the_installed_torchtitan_has_everything_the_project_uses():
    assert missing_api() == []
    check_torchtitan_api()  # does not raise


def test_the_entry_list_covers_what_the_recipes_set():
    def fields_of(name):
        return {f for e in TORCHTITAN_API if e.name == name for f in e.fields}

    assert {"disable_cuda_graphs", "local_batch_size", "global_batch_size", "seq_len", "steps",
            "mixed_precision_param"} <= fields_of("TrainingConfig")
    assert {"initial_load_path", "initial_load_in_hf", "initial_load_model_only", "last_save_in_hf",
            "last_save_model_only", "export_dtype"} <= fields_of("CheckpointManager.Config")
    assert "model_spec" in fields_of("Trainer.Config")
    assert any(e.name == "model_registry" and "converters" in e.parameters for e in TORCHTITAN_API)


def test_every_entry_says_since_when_upstream_has_it():
    """No entry keeps a vague `since`: each names the date, commit and pull request from which upstream main has
    the name, and a name upstream dropped also names the date and commit that removed it."""
    dated = re.compile(r"upstream (has it since|had it from) \d{4}-\d{2}-\d{2} \([0-9a-f]{9}, #\d+[;)]")
    removed = re.compile(r"until \d{4}-\d{2}-\d{2}, when [0-9a-f]{9} \(#\d+\) ")
    assert [e.target for e in TORCHTITAN_API if not dated.match(e.since)] == []
    assert [e.target for e in TORCHTITAN_API if "had it from" in e.since and not removed.search(e.since)] == []


def test_a_missing_dataclass_field_is_named_with_its_use_and_date(fake_titan):
    entry = ApiEntry(FAKE, "TrainingConfig", "the recipes set it", fields=("disable_cuda_graphs", "seq_len"),
                     since="upstream has it since 2026-08-13")
    assert missing_api((entry,)) == [
        f"{FAKE}.TrainingConfig has no field disable_cuda_graphs (the recipes set it; upstream has it since "
        "2026-08-13)"
    ]


def test_missing_parameters_attributes_and_assignments_are_named(fake_titan):
    entries = (
        ApiEntry(FAKE, "model_registry", "kernel converters are passed to it", parameters=("flavor", "converters")),
        ApiEntry(FAKE, "MetricsProcessor", "titan_metrics.py overrides them", assigns=("logger", "gpu_peak_flops")),
        ApiEntry(FAKE, "TrainingConfig", "x", attributes=("build",)),
        ApiEntry(FAKE, "Trainer.Config", "the recipes return one"),
    )
    messages = missing_api(entries)
    assert len(messages) == 4
    assert messages[0].startswith(f"{FAKE}.model_registry has no parameter converters (kernel converters")
    assert messages[1].startswith(f"{FAKE}.MetricsProcessor.__init__ does not set self.gpu_peak_flops")
    assert messages[2].startswith(f"{FAKE}.TrainingConfig has no attribute build")
    assert messages[3].startswith(f"{FAKE} has no Trainer.Config (the recipes return one;")


def test_a_module_that_cannot_be_imported_is_named():
    (message,) = missing_api((ApiEntry("torchtitan.protocols.model_converter", "ModelConfigConverter", "y"),))
    assert message.startswith(
        "torchtitan.protocols.model_converter.ModelConfigConverter: module torchtitan.protocols.model_converter "
        "cannot be imported (ModuleNotFoundError"
    )


def test_the_check_raises_listing_every_missing_name(fake_titan):
    entries = (
        ApiEntry(FAKE, "TrainingConfig", "the recipes set them", fields=("disable_cuda_graphs", "steps")),
        ApiEntry(FAKE, "model_registry", "z", parameters=("converters",)),
    )
    with pytest.raises(TorchtitanApiError) as raised:
        check_torchtitan_api(entries=entries)
    text = str(raised.value)
    assert "lacks 3 name(s)" in text
    for name in ("no field disable_cuda_graphs", "no field steps", "no parameter converters"):
        assert name in text


def test_entries_for_another_backend_are_left_out(fake_titan):
    entry = ApiEntry(FAKE, "TrainingConfig", "the cpu backend patches it", fields=("gone",), backends=("cpu",))
    assert len(missing_api((entry,), backend="cpu")) == 1
    assert missing_api((entry,), backend="neuron") == []


def test_importing_the_checker_imports_neither_torch_nor_torchtitan():
    code = "import sys, qwen3_pilot.titan_api; print(sorted({'torch', 'torchtitan'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"
