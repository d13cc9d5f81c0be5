"""The stage harness (StageRun): a failure reaches the console, its log is kept past Snakemake's rerun and its
record keeps what the stage measured; an input changed since its producer recorded it stops the stage before its
work (the chain of custody); a stage script's process ends with its work."""

from __future__ import annotations

import json

import pytest

from qwen3_pilot.stage_progress import record_measured
from qwen3_pilot.stage_run import StageRun


def test_a_failed_job_keeps_its_log_under_a_timestamped_name_and_its_record_what_it_measured(tmp_path, capsys,
                                                                                              monkeypatch):
    monkeypatch.chdir(tmp_path)  # the failure record goes to results/failures/ of the workflow folder
    log_path = tmp_path / "logs" / "train_native.log"
    with pytest.raises(ValueError):
        with StageRun("train_native", log_path) as stage_run:
            stage_run.log.info("before the failure")
            record_measured(step1_loss=5.07)
            raise ValueError("rope_theta: built 1e6, checkpoint 5e6")
    kept = list(log_path.parent.glob("train_native.failed-*.log"))
    assert len(kept) == 1
    assert "before the failure" in kept[0].read_text() and "rope_theta" in kept[0].read_text()
    console = capsys.readouterr().err
    assert "ValueError: rope_theta: built 1e6, checkpoint 5e6" in console and str(kept[0]) in console
    record = json.loads((tmp_path / "results" / "failures" / "train_native.json").read_text())
    assert record["status"] == "fail" and "rope_theta" in record["figures"]["reason"]
    assert record["figures"]["step1_loss"] == 5.07 and record["started"] < record["ended"]
    # The next stage in the same process starts with nothing measured.
    with pytest.raises(ValueError), StageRun("train_hf", tmp_path / "logs" / "train_hf.log"):
        raise ValueError("another")
    assert "step1_loss" not in json.loads((tmp_path / "results" / "failures" / "train_hf.json").read_text())["figures"]


def test_a_job_that_succeeds_leaves_only_its_log(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    log_path = tmp_path / "ok.log"
    with StageRun("ok", log_path) as stage_run:
        stage_run.log.info("done")
    assert [p.name for p in tmp_path.iterdir()] == ["ok.log"]


def test_a_stage_whose_input_changed_after_its_producer_recorded_it_fails_before_its_work(tmp_path, capsys,
                                                                                          monkeypatch):
    """The chain of custody at a stage's start: one changed byte in a file its producer recorded stops the
    stage before its body runs, naming the file; the same inputs untouched let it run."""
    import logging

    from qwen3_pilot.artifacts import CustodyError, sha256_file, write_recorded_json
    from qwen3_pilot.backends import COMPILER_CACHE_KEYS

    monkeypatch.chdir(tmp_path)  # the workflow folder: results/ is where recorded files live
    for key in COMPILER_CACHE_KEYS:  # StageRun points these at the project's caches; restored after the test
        monkeypatch.setenv(key, str(tmp_path / "caches" / key))
    weights = tmp_path / "results" / "fetch_weights" / "weights.bin"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"\x00\x01\x02\x03")
    recorded = sha256_file(weights)
    write_recorded_json(weights.with_name("summary.json"), {"stage": "fetch_weights", "artifacts": [
        {"path": "results/fetch_weights/weights.bin", "bytes": 4, "sha256": recorded}]})
    consumes = ["results/fetch_weights/weights.bin", "results/fetch_weights/summary.json"]  # a job's inputs
    ran = []
    try:
        with StageRun("train_native", "logs/train_native/train_native.log", consumes):
            ran.append("untouched")
        weights.write_bytes(b"\x00\x01\x02\x04")
        with pytest.raises(CustodyError, match=f"results/fetch_weights/weights.bin: fetch_weights recorded sha256 "
                                               f"{recorded}, the file now has {sha256_file(weights)}"):
            with StageRun("train_native", "logs/train_native/train_native.log", consumes):
                ran.append("changed")
    finally:
        logging.getLogger().handlers.clear()  # StageRun's handler writes to the closed log file
    assert ran == ["untouched"]  # the stage's work never started on the changed input
    assert "CustodyError" in capsys.readouterr().err


ENDING_STAGE = """
import atexit, sys
from pathlib import Path
from qwen3_pilot.stage_run import StageRun

atexit.register(lambda: Path("exit_handler_ran").write_text("yes"))
with StageRun("stage", "logs/stage.log", end_process=True) as stage_run:
    stage_run.log.info("the work")
    print("unflushed output of the stage", end="")
sys.stderr.write("after the stage\\n")  # never reached: the process ended with the stage
"""


@pytest.mark.parametrize("fails", [False, True])
def test_a_stage_process_ends_with_its_work_and_a_failure_still_fails(tmp_path, fails):
    """A stage script's process exits right after a successful stage (exit handlers run, output flushed);
    a failed stage raises as before, so Snakemake sees the failure."""
    import subprocess
    import sys

    script = ENDING_STAGE.replace('stage_run.log.info("the work")', 'raise ValueError("the check failed")' if fails
                                  else 'stage_run.log.info("the work")')
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert (result.returncode != 0) is fails, result.stderr
    assert "after the stage" not in result.stderr
    assert (tmp_path / "exit_handler_ran").read_text() == "yes"
    log = (tmp_path / "logs" / "stage.log").read_text()
    if fails:
        assert "ValueError: the check failed" in result.stderr and "the check failed" in log
    else:
        assert "the work" in log and "unflushed output of the stage" in log


def test_what_a_stage_writes_records_the_code_that_ran_it(tmp_path, monkeypatch):
    """The job's code digest (its rule's `code` param) and the commit of the workflow folder, in every record the
    stage writes, a failure's too; a record made outside a StageRun claims no code."""
    import subprocess

    from qwen3_pilot.summary import StageSummary

    monkeypatch.chdir(tmp_path)
    subprocess.run(["git", "init", "-q"], check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "c"],
                   check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    digest = "c0de" * 16
    with StageRun("ok", tmp_path / "ok.log", code_digest=digest):
        written = StageSummary(stage="ok", status="pass", backend="cpu").write(tmp_path / "summary.json")
    assert written["code"] == {"digest": digest, "commit": head, "dirty": False}
    with pytest.raises(ValueError), StageRun("bad", tmp_path / "bad.log", code_digest=digest):
        raise ValueError("failed")
    assert json.loads((tmp_path / "results" / "failures" / "bad.json").read_text())["code"]["digest"] == digest
    assert StageSummary(stage="ok", status="pass", backend="cpu").code == {}
