"""The report: built from the stage summaries only, not-built stages shown as not_run, HTML escaped."""

from __future__ import annotations

import json

import pytest

from qwen3_pilot.report import NOT_BUILT, STAGES, build_report, overall_status
from qwen3_pilot.summary import StageSummary

CONFIG = {"backend": "cpu", "weights": {"source": "fixture"}}


def write_summary(folder, stage, status="pass", **fields):
    path = folder / f"{stage}.json"
    StageSummary(stage=stage, status=status, backend="cpu", **fields).write(path)
    return path


def build(tmp_path, summaries, config=CONFIG):
    return build_report(
        summaries=summaries, config=config, config_digest="d" * 64, workflow_dir=tmp_path,
        html_path=tmp_path / "report.html", json_path=tmp_path / "report.json",
    )


def test_stages_without_a_summary_are_not_run_never_pass(tmp_path):
    report = build(tmp_path, {"pin_env": write_summary(tmp_path, "pin_env", figures={"packages": []})})
    by_stage = {s["stage"]: s for s in report["stages"]}
    assert [s["stage"] for s in report["stages"]] == [name for name, _ in STAGES]
    assert by_stage["pin_env"]["status"] == "pass"
    for stage in ("train_native", "train_hf", "export_reload", "kernel_numerics", "moe_reduced", "benchmark"):
        assert by_stage[stage]["status"] == "not_run"
        assert by_stage[stage]["notes"] == [NOT_BUILT]
    assert report["status"] == "incomplete"
    on_disk = json.loads((tmp_path / "report.json").read_text())
    assert on_disk["provenance"]["config_digest"] == "d" * 64
    assert on_disk["provenance"]["commit"]


def test_everything_written_into_html_is_escaped(tmp_path):
    hostile = "<script>alert(1)</script>"
    summaries = {"fetch_corpus": write_summary(
        tmp_path, "fetch_corpus", figures={"source": hostile}, notes=[hostile], proves=hostile)}
    build(tmp_path, summaries)
    html = (tmp_path / "report.html").read_text()
    assert "<script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_a_list_of_records_is_shown_as_an_escaped_table(tmp_path):
    rows = [{"field": "rope_theta", "built": 1e6, "checkpoint": 5e6, "verdict": "MISMATCH <b>"},
            {"field": "head_dim", "built": 128, "checkpoint": 128, "verdict": "match"}]
    build(tmp_path, {"train_native": write_summary(tmp_path, "train_native", figures={"parity": rows})})
    html = (tmp_path / "report.html").read_text()
    assert "<th>built</th><th>checkpoint</th><th>field</th><th>verdict</th>" in html
    assert "<td>1000000.0</td><td>5000000.0</td><td>rope_theta</td><td>MISMATCH &lt;b&gt;</td>" in html


def test_a_summary_for_another_stage_is_refused(tmp_path):
    with pytest.raises(ValueError, match="holds stage 'fetch_corpus', expected 'pin_env'"):
        build(tmp_path, {"pin_env": write_summary(tmp_path, "fetch_corpus")})


def test_overall_status():
    stage = lambda name, status: {"stage": name, "status": status}  # noqa: E731
    assert overall_status([stage("a", "pass"), stage("b", "pass")], set()) == "pass"
    assert overall_status([stage("a", "pass"), stage("b", "not_run")], set()) == "incomplete"
    assert overall_status([stage("a", "pass"), stage("b", "not_run")], {"b"}) == "pass"
    assert overall_status([stage("a", "fail"), stage("b", "not_run")], set()) == "fail"


def test_unknown_status_is_refused():
    with pytest.raises(ValueError, match="status 'passed' is not one of"):
        StageSummary(stage="x", status="passed", backend="cpu")


def test_the_report_is_readable_by_others(tmp_path):
    import os

    previous = os.umask(0o022)
    try:
        build(tmp_path, {})
    finally:
        os.umask(previous)
    assert (tmp_path / "report.html").stat().st_mode & 0o777 == 0o644


def test_stages_with_steps_get_a_loss_plot(tmp_path):
    steps = [{"step": 1, "loss": 5.6}, {"step": 2, "loss": 5.5}]
    build(tmp_path, {"train_native": write_summary(tmp_path, "train_native", figures={"steps": steps})})
    html = (tmp_path / "report.html").read_text()
    assert '<img alt="per-step loss of the training stages" src="data:image/png;base64,iVBOR' in html
    build(tmp_path, {})
    assert "data:image/png" not in (tmp_path / "report.html").read_text()
