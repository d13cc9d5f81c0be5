"""The compatibility matrix's rows that CI runs (qwen3_pilot.tools.titan_compat): the installed torchtitan 0.3.0 trains
every recipe for 2 steps from the shared run's recorded launches, and torchtitan 0.2.2 from PyPI is refused before
any launch, with the reason in its cells. The upstream-commit rows are `make titan-compat`'s (docs)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import started_ahead

from qwen3_pilot.recipe_registry import RECIPES
from qwen3_pilot.tools.titan_compat import INSTALLED, Torchtitan, markdown, matrix

WHEEL = os.environ.get("TORCHTITAN_0_2_2_WHEEL")


@pytest.mark.torchrun
@started_ahead(once_trained=True, in_place=True)
def test_0_3_0_trains_every_recipe_and_0_2_2_is_refused(trained_run, _):
    """(In the background: three launches and two API probes, about 55 CPU-seconds.)"""
    if not WHEEL:
        pytest.skip("TORCHTITAN_0_2_2_WHEEL names no wheel (.ci/run downloads torchtitan 0.2.2)")
    stages = [trained_run / "results" / recipe.stage for recipe in RECIPES]
    before = {path: path.read_bytes() for stage in stages for path in stage.rglob("*") if path.is_file()}
    rows = matrix(trained_run, [Torchtitan(INSTALLED, None), Torchtitan("pypi-0.2.2", Path(WHEEL))], steps=2)
    # The relaunches wrote nothing into the stages' own folders (the MoE's router load included).
    after = {path: path.read_bytes() for stage in stages for path in stage.rglob("*") if path.is_file()}
    assert [str(path) for path in after if after[path] != before.get(path)] == []
    installed, old = rows
    assert (installed["version"], installed["level"]) == ("torchtitan 0.3.0", "hf_datasets")
    for recipe, cell in installed["recipes"].items():
        assert cell["works"] and cell["why"].startswith("trained ") and len(cell["why"].split(", ")) == 2, recipe
    assert (old["version"], old["level"]) == ("torchtitan 0.2.2", None)
    for cell in old["recipes"].values():
        assert not cell["works"] and cell["why"].startswith("refused: the installed torchtitan (torchtitan 0.2.2) "
                                                            "predates upstream's config refactor")
    table = markdown(rows, 2)
    assert table.count("| works: trained ") == 3 and table.count("| fails: refused: ") == 3
    assert len(table.splitlines()) == 4 + len(rows) and all(recipe.config_function in table for recipe in RECIPES)


def test_a_folder_without_a_finished_run_is_refused_naming_what_is_missing(tmp_path):
    with pytest.raises(SystemExit, match="no recorded launch for train_native, train_hf, moe_reduced"):
        matrix(tmp_path, [Torchtitan(INSTALLED, None)], steps=2)


def test_a_cell_names_what_is_missing_without_who_uses_it():
    """The table's cells drop the "(who uses it)" each missing-name message ends with, its own parentheses included;
    the JSON keeps the whole message."""
    from qwen3_pilot.tools.titan_compat import without_reason

    assert without_reason("torchtitan.config.CommConfig has no field train_timeout_seconds (the recipes set them "
                          "(training.comm_*_timeout_s))") == "torchtitan.config.CommConfig has no field " \
                                                             "train_timeout_seconds"
    assert without_reason("m.X: module m cannot be imported (TypeError: bad) (the HF recipe builds on it)") == \
        "m.X: module m cannot be imported (TypeError: bad)"
    assert without_reason("no reason given") == "no reason given"


def test_a_torchtitan_is_probed_once_per_process_and_each_caller_gets_its_own_copy(tmp_path):
    """The preflight's fork check and the fork's launches read the same probe: its subprocess (importing torchtitan,
    about 8 CPU-seconds) runs once."""
    import subprocess

    from qwen3_pilot.tools import titan_compat

    started = []
    probe = {"version": "torchtitan 9", "file": str(tmp_path / "torchtitan" / "__init__.py"), "refused": None,
             "level": "hf_datasets", "missing": {}, "missing_on_neuron": {"qwen3_hf": []}}

    def fake_run(command, **kwargs):
        started.append(command)
        return subprocess.CompletedProcess(command, 0, json.dumps(probe) + "\n", "")

    torchtitan = Torchtitan("probed-once", tmp_path)
    first = titan_compat.api_probe(torchtitan, fake_run)
    first["missing_on_neuron"]["qwen3_hf"].append("changed by a caller")
    assert titan_compat.api_probe(Torchtitan("probed-once", tmp_path), fake_run) == probe
    assert len(started) == 1
