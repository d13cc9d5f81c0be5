"""Stage fail_fast against a torchtitan that lacks a name one recipe uses: the stage fails, and with it the run,
before any training stage starts; its failure names the recipe and the name, and its record has every check's
outcome with how long it took (the other recipes still launched)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import AHEAD_ENV, output, run_snakemake, started_ahead

pytestmark = [pytest.mark.e2e, pytest.mark.torchrun]

HF_REGISTRY = Path("experiments") / "transformers_modeling_backend" / "config_registry.py"


def torchtitan_without(site: Path, relative: Path, name: str) -> Path:
    """The installed torchtitan copied under `site` with the function `name` renamed away in `relative`."""
    installed = Path(importlib.util.find_spec("torchtitan").submodule_search_locations[0])
    copy = site / "torchtitan"
    shutil.copytree(installed, copy, ignore=shutil.ignore_patterns("__pycache__"))
    source = (copy / relative).read_text()
    assert f"def {name}(" in source
    (copy / relative).write_text(source.replace(f"def {name}(", f"def _{name}_removed("))
    return site


@started_ahead(once_trained=True)
def test_fail_fast_fails_first_naming_the_recipe_for_a_torchtitan_that_lacks_its_name(copy_of_run, scratch):
    site = torchtitan_without(scratch / "site", HF_REGISTRY, "transformers_modeling_backend_full")
    env = {**AHEAD_ENV, "PYTHONPATH": os.pathsep.join([str(site), AHEAD_ENV.get("PYTHONPATH", "")])}
    stages = ("train_native", "train_hf", "moe_reduced")
    result = run_snakemake(copy_of_run, "--cores", "2", *(f"results/{stage}/summary.json" for stage in stages),
                           "--forcerun", "fail_fast", "train", "moe_reduced", env=env)
    text = output(result)
    assert result.returncode != 0
    assert "fail_fast: 1 of 4 checks failed" in text, text[-3000:]
    assert "recipe train_hf" in text and "the recipe qwen3_hf uses" in text, text[-3000:]
    assert "transformers_modeling_backend_full" in text
    # No training job started: the copy holds no logs, and a started job writes its own.
    assert not [stage for stage in stages if (copy_of_run / "logs" / stage).exists()], text[-3000:]
    failure = json.loads((copy_of_run / "results" / "failures" / "fail_fast.json").read_text())
    checks = {check["name"]: check for check in failure["figures"]["checks"]}
    assert checks["train_hf"]["status"] == "fail"
    assert "transformers_modeling_backend_full" in checks["train_hf"]["error"]
    assert [checks[name]["status"] for name in ("train_native", "moe_reduced")] == ["pass", "pass"]
    assert all(check["seconds"] >= 0 for check in checks.values())
