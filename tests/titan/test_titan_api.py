"""The torchtitan API check: the installed torchtitan 0.3.0 has every name the project uses, and a
torchtitan without one of them is refused with the name and why the project needs it (docs/torchtitan-compat.md
says since when upstream has each)."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
from conftest import PROJECT, fake_fork, pre_refactor_torchtitan

from qwen3_pilot.titan.api_names import TORCHTITAN_API, ApiEntry
from qwen3_pilot.titan.titan_api import TorchtitanApiError, check_torchtitan_api, missing_api

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

    assert {"local_batch_size", "global_batch_size", "seq_len", "steps", "mixed_precision_param",
            "num_tokens_per_microbatch_per_dp_rank", "num_tokens_per_train_step", "max_context_length"} <= fields_of(
        "TrainingConfig")
    assert {"initial_load_path", "initial_load_in_hf", "initial_load_model_only", "last_save_in_hf",
            "last_save_model_only", "export_dtype"} <= fields_of("CheckpointManager.Config")
    assert "model_spec" in fields_of("Trainer.Config")
    assert any(e.name == "model_registry" and "converters" in e.parameters for e in TORCHTITAN_API)


def test_docs_say_since_when_upstream_has_each_name_the_code_checks():
    """The history lives in docs/torchtitan-compat.md's table, one row per entry in the code's order: its name, what
    it must have, and the date, commit and pull request from which upstream main has it (a name upstream dropped
    also the date and commit that removed it)."""
    text = (PROJECT / "docs" / "torchtitan-compat.md").read_text()
    rows = [line.split(" | ") for line in text.split("## When upstream got each name")[1].splitlines()
            if line.startswith("| `")]
    assert [row[0].strip("| `") for row in rows] == [entry.target for entry in TORCHTITAN_API]
    dated = re.compile(r"(since|from) \d{4}-\d{2}-\d{2} \([0-9a-f]{9}, #\d+[;)]")
    removed = re.compile(r"until \d{4}-\d{2}-\d{2}, when [0-9a-f]{9} \(#\d+\) ")
    assert [row[0] for row in rows if not dated.match(row[2])] == []
    assert [row[0] for row in rows if row[2].startswith("from ") and not removed.search(row[2])] == []


def test_a_missing_dataclass_field_is_named_with_its_use(fake_titan):
    entry = ApiEntry(FAKE, "TrainingConfig", "the recipes set it", fields=("disable_cuda_graphs", "seq_len"))
    assert missing_api((entry,)) == [f"{FAKE}.TrainingConfig has no field disable_cuda_graphs (the recipes set it)"]


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
    assert messages[3] == f"{FAKE} has no Trainer.Config (the recipes return one)"


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
    code = "import sys, qwen3_pilot.titan.titan_api; print(sorted({'torch', 'torchtitan'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"


def test_a_recipe_is_checked_only_for_the_names_it_uses(fake_titan):
    hf_only = ApiEntry(FAKE, "TrainingConfig", "the HF recipe sets it", fields=("gone",), users=("qwen3_hf",))
    assert missing_api((hf_only,), user="qwen3_native") == []
    check_torchtitan_api(entries=(hf_only,), user="qwen3_native")  # the native recipe starts
    with pytest.raises(TorchtitanApiError, match=r"1 name\(s\) the recipe qwen3_hf uses:\n  - .*has no field gone"):
        check_torchtitan_api(entries=(hf_only,), user="qwen3_hf")


def test_every_entry_names_known_users_and_each_recipe_has_its_own_list():
    from qwen3_pilot.titan.api_names import EXPORT, NUMERICS, RANK_PLAN, RECIPES

    assert {user for entry in TORCHTITAN_API for user in entry.users} == {*RECIPES, RANK_PLAN, NUMERICS, EXPORT}
    per_recipe = {recipe: {e.target for e in TORCHTITAN_API if recipe in e.users} for recipe in RECIPES}
    assert "torchtitan.experiments.transformers_modeling_backend.configs.TransformersBackendConfig" in \
        per_recipe["qwen3_hf"] - per_recipe["qwen3_native"]
    assert "torchtitan.models.common.moe.MoE" in per_recipe["qwen3_moe_reduced"] - per_recipe["qwen3_hf"]


def test_a_name_is_found_in_another_home_and_imported_from_there(fake_titan, monkeypatch):
    from qwen3_pilot.titan.titan_api import import_home

    old_home = types.ModuleType("fake_old_home")

    @dataclasses.dataclass
    class LRSchedulersContainer:
        @dataclasses.dataclass
        class Config:
            warmup_steps: int = 0

    old_home.LRSchedulersContainer = LRSchedulersContainer
    monkeypatch.setitem(sys.modules, "fake_old_home", old_home)
    entry = ApiEntry(FAKE, "LRSchedulersContainer.Config", "the recipes set them", fields=("warmup_steps",),
                     homes=("fake_old_home",))
    assert missing_api((entry,)) == [] and import_home(entry) is LRSchedulersContainer
    gone = dataclasses.replace(entry, homes=("fake_nowhere",))
    (message,) = missing_api((gone,))
    assert message == f"{FAKE} has no LRSchedulersContainer.Config (the recipes set them); not in fake_nowhere either"
    with pytest.raises(TorchtitanApiError, match="not in fake_nowhere"):
        import_home(gone)


def test_the_two_names_upstream_moved_in_august_are_imported_from_where_0_3_0_keeps_them():
    from qwen3_pilot.titan.api_names import CHECKPOINT_MANAGER, LR_SCHEDULERS
    from qwen3_pilot.titan.titan_api import import_home

    assert import_home(CHECKPOINT_MANAGER).__module__.startswith("torchtitan.components.checkpoint")
    assert import_home(LR_SCHEDULERS).__name__ == "LRSchedulersContainer"
    assert CHECKPOINT_MANAGER.homes == ("torchtitan.components.checkpoint",)
    assert LR_SCHEDULERS.homes == ("torchtitan.components.lr_scheduler",)


def refusal_in(path, tmp_path) -> subprocess.CompletedProcess:
    code = ("from qwen3_pilot.titan.titan_api import check_torchtitan_api, TorchtitanApiError\n"
            "try:\n    check_torchtitan_api(user='qwen3_native')\nexcept TorchtitanApiError as error:\n"
            "    print(error)\n    raise SystemExit(3)\n")
    env = {**os.environ, "PYTHONPATH": f"{path}{os.pathsep}{PROJECT / 'workflow' / 'scripts'}"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)


def test_a_torchtitan_from_before_the_config_refactor_is_refused_at_once(tmp_path):
    result = refusal_in(pre_refactor_torchtitan(tmp_path), tmp_path)
    assert result.returncode == 3, result.stderr[-2000:]
    assert "predates upstream's config refactor of 2026-02-23 (9810191bb, #2386)" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.skipif(not os.environ.get("TORCHTITAN_0_2_2_WHEEL"),
                    reason="TORCHTITAN_0_2_2_WHEEL names no wheel (.ci/run downloads torchtitan 0.2.2 and sets it)")
def test_torchtitan_0_2_2_from_pypi_is_refused_at_once(tmp_path):
    import zipfile

    wheel = Path(os.environ["TORCHTITAN_0_2_2_WHEEL"])
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(tmp_path / "site")
    result = refusal_in(tmp_path / "site", tmp_path)
    assert result.returncode == 3, result.stderr[-2000:]
    assert "(torchtitan 0.2.2) predates upstream's config refactor" in result.stdout


def test_a_trainer_checks_the_recipe_it_was_started_with():
    from qwen3_pilot.titan.in_ranks.train_entry import config_function

    assert config_function(["-m", "x", "--module", "m", "--config", "qwen3_hf", "--dump_folder", "d"]) == "qwen3_hf"
    assert config_function(["--config=qwen3_native"]) == "qwen3_native"
    assert config_function(["--module", "m"]) is None


def test_on_neuron_the_native_recipe_starts_from_the_forks_qwen3_recipe_where_it_has_one(monkeypatch):
    from qwen3_pilot.titan.titan_api import native_base

    upstream = "torchtitan.models.qwen3.config_registry:qwen3_32b"
    assert native_base("cpu")[1] == upstream
    assert native_base("neuron")[1] == upstream  # no fork installed here
    fake_fork(monkeypatch, "def qwen3_8b_tp4_fsdp16_sac():\n    return 'the fork recipe'\n")
    function, name = native_base("neuron")
    assert name == "torchtitan_neuron.models.qwen3.config_registry:qwen3_8b_tp4_fsdp16_sac"
    assert function() == "the fork recipe"
    assert native_base("cpu")[1] == upstream  # the cpu backend never takes the fork's


def test_a_fork_without_that_recipe_falls_back_and_a_broken_one_is_an_error(monkeypatch):
    from qwen3_pilot.titan.titan_api import native_base

    fake_fork(monkeypatch, "def qwen3_other():\n    pass\n")
    assert native_base("neuron")[1] == "torchtitan.models.qwen3.config_registry:qwen3_32b"
    monkeypatch.delitem(sys.modules, "torchtitan_neuron.models.qwen3.config_registry")

    def failing_import(name, *args, **kwargs):
        if name.startswith("torchtitan_neuron"):
            raise ModuleNotFoundError("No module named 'nkilib'", name="nkilib")
        return real_import(name, *args, **kwargs)

    import importlib

    real_import = importlib.import_module
    monkeypatch.setattr(importlib, "import_module", failing_import)
    with pytest.raises(ModuleNotFoundError, match="nkilib"):
        native_base("neuron")
