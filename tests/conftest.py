"""Shared helpers: a copy of the workflow in a temp folder, and Snakemake run inside it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

PROJECT = Path(__file__).resolve().parents[1]
SHARED_CORPUS = PROJECT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
WORKFLOW_FILES = ("Snakefile", "rules", "config", "envs", "profiles", "workflow")
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))

# Collecting the tests imports torchtitan, and with it torch._dynamo, which creates its cache folder in the
# system temp folder unless told otherwise; the stages keep theirs under .cache/ (backends.cache_env).
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(PROJECT / ".cache" / "torchinductor"))


def make_workspace(root: Path, overlay: dict | None = None) -> Path:
    """Copies the workflow (not its results) into `root`; `overlay` is written as config/test.yaml."""
    root.mkdir(parents=True, exist_ok=True)
    for name in WORKFLOW_FILES:
        source = PROJECT / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, root / name)
    if overlay is not None:
        (root / "config" / "test.yaml").write_text(yaml.safe_dump(overlay))
    return root


def run_snakemake(workspace: Path, *args: str, timeout: float = 1500) -> subprocess.CompletedProcess:
    extra = ["--configfile", "config/test.yaml"] if (workspace / "config" / "test.yaml").exists() else []
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(
        [SNAKEMAKE, *args, *extra], cwd=workspace, capture_output=True, text=True, timeout=timeout, env=env
    )


def planned_jobs(result: subprocess.CompletedProcess) -> dict[str, int]:
    """The 'Job stats' table of a dry run as {rule: count}; empty when there is nothing to do."""
    jobs: dict[str, int] = {}
    lines = result.stdout.splitlines() + result.stderr.splitlines()
    if "Job stats:" not in lines:
        return jobs
    for line in lines[lines.index("Job stats:") + 3:]:
        parts = line.split()
        if len(parts) != 2 or parts[0] == "total":
            break
        jobs[parts[0]] = int(parts[1])
    return jobs


def default_config(*overlays: dict) -> dict:
    """config/config.yaml with `overlays` laid over it (as --configfile does), the schema's defaults and the
    derived keys filled in (not checked: tests build broken configs from it)."""
    from snakemake.utils import validate

    from qwen3_pilot.config import deep_update, fill_derived

    config = yaml.safe_load((PROJECT / "config" / "config.yaml").read_text())
    for overlay in overlays:
        config = deep_update(config, overlay)
    validate(config, str(PROJECT / "workflow" / "schemas" / "config.schema.yaml"))
    return fill_derived(config)


def backend_config(backend: str = "cpu", ranks: int = 2, **keys) -> dict:
    """The config keys a backend is built from (what the rules pass), the schema's defaults for the rest."""
    from qwen3_pilot.backends import BACKEND_CONFIG_KEYS

    config = default_config()
    return {**{key: config[key] for key in BACKEND_CONFIG_KEYS}, "backend": backend, "ranks": ranks, **keys}


def planned_stages(result: subprocess.CompletedProcess) -> set[str]:
    """The stages a dry run plans, from its job blocks ("rule train:" ... "wildcards: recipe=train_hf")."""
    from qwen3_pilot.report import stage_of_job

    stages, rule, wildcards = set(), None, {}
    for line in (result.stdout + result.stderr).splitlines() + [""]:
        if line.startswith("rule ") and line.endswith(":"):
            rule, wildcards = line[5:-1], {}
        elif rule and line.strip().startswith("wildcards:"):
            wildcards = dict(pair.split("=", 1) for pair in line.split(":", 1)[1].strip().split(", "))
        elif rule and not line.startswith(" "):
            stages.add(stage_of_job(rule, wildcards))
            rule = None
    return stages - {"all"}  # the default target's rule, not a stage


@pytest.fixture
def workspace(tmp_path: Path):
    return lambda overlay=None: make_workspace(tmp_path / "ws", overlay)


def output(result: subprocess.CompletedProcess) -> str:
    return result.stdout + result.stderr


# The e2e tests' config: 2 gloo ranks, the offline corpus, a small fixture.
SMALL = {
    "ranks": 2,
    "data": {"path": str(SHARED_CORPUS)},
    "fixture": {"steps": 120, "num_hidden_layers": 2},
    "benchmark": {"warmup_steps": 2, "measured_steps": 5},
}


@pytest.fixture(scope="session")
def completed_run(tmp_path_factory):
    """The whole DAG once on a small cpu config; tests that change it work on a copy (`copy_of_run`)."""
    ws = make_workspace(tmp_path_factory.mktemp("e2e") / "ws", SMALL)
    result = run_snakemake(ws, "--cores", "2", "results/report.html")
    assert result.returncode == 0, output(result)[-6000:]
    return ws


@pytest.fixture
def copy_of_run(completed_run, tmp_path):
    """A throwaway copy of the completed workspace (results, logs and Snakemake's metadata included)."""
    copy = tmp_path / "ws"
    shutil.copytree(completed_run, copy, symlinks=True)
    return copy
