"""Stage logs: a failure reaches the console and its log is kept past Snakemake's rerun."""

from __future__ import annotations

import json

import pytest

from qwen3_pilot.stagelog import stage_log


def test_a_failed_job_keeps_its_log_under_a_timestamped_name(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the failure record goes to results/failures/ of the workflow folder
    log_path = tmp_path / "logs" / "train_native.log"
    with pytest.raises(ValueError):
        with stage_log(log_path) as log:
            log.info("before the failure")
            raise ValueError("rope_theta: built 1e6, checkpoint 5e6")
    kept = list(log_path.parent.glob("train_native.failed-*.log"))
    assert len(kept) == 1
    assert "before the failure" in kept[0].read_text() and "rope_theta" in kept[0].read_text()
    console = capsys.readouterr().err
    assert "ValueError: rope_theta: built 1e6, checkpoint 5e6" in console and str(kept[0]) in console
    record = json.loads((tmp_path / "results" / "failures" / "logs.json").read_text())
    assert record["status"] == "fail" and "rope_theta" in record["figures"]["reason"]


def test_a_job_that_succeeds_leaves_only_its_log(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    log_path = tmp_path / "ok.log"
    with stage_log(log_path) as log:
        log.info("done")
    assert [p.name for p in tmp_path.iterdir()] == ["ok.log"]
