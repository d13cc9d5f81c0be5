"""End to end: the DAG built so far on a small cpu config, then the caching guarantees on that run."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from conftest import SHARED_CORPUS, SNAKEMAKE, make_workspace, output, planned_jobs, run_snakemake

pytestmark = pytest.mark.e2e

SMALL = {
    "ranks": 2,
    "data": {"path": str(SHARED_CORPUS)},
    "fixture": {"steps": 120, "num_hidden_layers": 2},
}


@pytest.fixture(scope="module")
def completed_run(tmp_path_factory):
    ws = make_workspace(tmp_path_factory.mktemp("e2e") / "ws", SMALL)
    result = run_snakemake(ws, "--cores", "2", "results/report.html")
    assert result.returncode == 0, output(result)[-6000:]
    return ws


def report(ws):
    return json.loads((ws / "results" / "report.json").read_text())


def test_report_holds_every_built_stage_as_pass(completed_run):
    stages = {s["stage"]: s for s in report(completed_run)["stages"]}
    for stage in ("pin_env", "fetch_corpus", "fixture_checkpoint", "fetch_weights", "verify_ranks"):
        assert stages[stage]["status"] == "pass", stage
        assert stages[stage]["artifacts"], stage
        assert stages[stage]["proves"] and stages[stage]["does_not_prove"], stage
    assert stages["train_native"]["status"] == "not_run"
    assert report(completed_run)["status"] == "incomplete"
    live = stages["verify_ranks"]["figures"]["live"]
    assert live["ranks_seen"] == 2 and live["dist_backend"] == "gloo"
    plan = stages["verify_ranks"]["figures"]["plan"]
    assert plan["total_params"] == 4_022_468_096 and plan["fits"]
    weights = stages["fetch_weights"]["figures"]
    assert weights["fixture"] and not weights["revision_pinned"]
    assert any("FIXTURE" in note for note in stages["fetch_weights"]["notes"])
    fixture = stages["fixture_checkpoint"]["figures"]
    assert fixture["final_loss"] < fixture["init_loss"] - 1.0
    assert (completed_run / "results" / "report.html").stat().st_size > 1000


def test_one_log_per_job(completed_run):
    logs = {p.relative_to(completed_run / "logs").as_posix() for p in (completed_run / "logs").rglob("*.log")}
    for expected in ("fetch_corpus/fetch_corpus.log", "verify_ranks/verify_ranks.log", "pin_env/torch.log",
                     "fetch_weights/fetch_weights.log", "report/report.log"):
        assert expected in logs


def test_a_complete_run_is_not_redone(completed_run):
    result = run_snakemake(completed_run, "--cores", "2", "results/report.html")
    assert result.returncode == 0
    assert "Nothing to be done" in output(result), output(result)


def test_parse_is_fast_and_imports_no_torch(completed_run):
    started = time.perf_counter()
    result = run_snakemake(completed_run, "-n")
    elapsed = time.perf_counter() - started
    assert result.returncode == 0 and planned_jobs(result) == {}
    assert elapsed < 3.0, f"snakemake -n took {elapsed:.2f} s"
    traced = subprocess.run(
        [sys.executable, "-X", "importtime", SNAKEMAKE, "-n", "--configfile", "config/test.yaml"],
        cwd=completed_run, capture_output=True, text=True,
    )
    imported = {line.split("|")[-1].strip() for line in traced.stderr.splitlines() if "|" in line}
    assert "snakemake" in imported
    assert not {m for m in imported if m == "torch" or m.startswith("torch.")}


def bump(ws, old, new):
    pins = ws / "envs" / "cpu.txt"
    text = pins.read_text()
    assert old in text
    pins.write_text(text.replace(old, new))
    return lambda: pins.write_text(text)


def test_a_transformers_bump_reruns_only_what_uses_transformers(completed_run):
    restore = bump(completed_run, "transformers==5.16.0", "transformers==5.17.0")
    try:
        jobs = planned_jobs(run_snakemake(completed_run, "-n"))
    finally:
        restore()
    assert jobs.get("pin_package") == 1
    assert "verify_ranks" not in jobs
    assert "fixture_checkpoint" not in jobs and "fetch_weights" not in jobs


def test_a_torch_bump_reruns_verify_ranks_but_not_the_fixture(completed_run):
    restore = bump(completed_run, "torch==2.14.1", "torch==2.14.2")
    try:
        jobs = planned_jobs(run_snakemake(completed_run, "-n"))
    finally:
        restore()
    assert jobs.get("pin_package") == 1
    assert jobs.get("verify_ranks") == 1
    assert "fixture_checkpoint" not in jobs and "fetch_weights" not in jobs
