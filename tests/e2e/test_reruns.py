"""docs/reruns.md against Snakemake's own plan: each edit in its table, made to the finished shared run, plans
exactly the jobs the table lists; and a judging edit changes the report's verdict without training again."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import (
    AHEAD_ENV,
    PROJECT,
    copy_run,
    edited_in_place,
    output,
    planned_job_blocks,
    record_fail_fast_run,
    run_snakemake,
    started_ahead,
)

from qwen3_pilot.changes import REUSED_BY_CONTENT
from qwen3_pilot.figure_view import number
from qwen3_pilot.parse_time.config import deep_update

pytestmark = pytest.mark.e2e

TABLE = PROJECT / "docs" / "reruns.md"


def section_table(heading: str | None = None) -> dict[str, set[str]]:
    """The two-column table under `heading` in docs/reruns.md (None: the page's first section, before any `## `):
    {its first cell: the jobs its second names in backticks}, the header row and the rule below it left out."""
    text = TABLE.read_text()
    section = text.split(f"\n## {heading}\n", 1)[1] if heading else text
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in section.split("\n## ", 1)[0].splitlines() if line.startswith("|")]
    return {cells[0]: set(re.findall(r"`([^`]+)`", cells[1])) for cells in rows[2:] if len(cells) == 2}


def table_rows() -> list[tuple[str, set[str]]]:
    """The config edits' table (the Neuron SDK release switch, further down, has its own test): (the edit as
    `dotted.key: yaml value`, the jobs planned as rule[wildcard])."""
    return [(edit.strip("`"), jobs) for edit, jobs in section_table().items()]


def as_overlay(edit: str) -> dict:
    key, value = edit.split(": ", 1)
    overlay: dict = yaml.safe_load(value)
    for part in reversed(key.split(".")):
        overlay = {part: overlay}
    return overlay


def planned_job_labels(result) -> set[str]:
    """A dry run's jobs as rule[wildcard values], as docs/reruns.md names them."""
    return {rule + "".join(f"[{value}]" for value in wildcards.values())
            for rule, wildcards in planned_job_blocks(result)}


def planned_past_fail_fast(ws: Path, env: dict[str, str] | None = None) -> tuple[set[str], str]:
    """The jobs a change runs, as rule[wildcard], and what the last dry run printed. fail_fast is a checkpoint: while
    it is due, a dry run lists every stage that reads its passed.json, which Snakemake plans again once it has run.
    So where it is due, `--touch` records its run without launching it (passed.json as it was, as a rerun that passes
    the same checks writes it; test_training_e2e's transformers pin change launches it for real), and a second dry
    run plans the rest. Leaves the copy with fail_fast recorded as run."""
    result = run_snakemake(ws, "-n", env=env)
    if result.returncode != 0:
        return {"(the dry run failed)"}, output(result)
    if "fail_fast" not in planned_job_labels(result):
        return planned_job_labels(result), output(result)
    record_fail_fast_run(ws, env)
    after = run_snakemake(ws, "-n", env=env)
    return {"fail_fast"} | planned_job_labels(after), output(after)


def with_overlay(ws, change, *args):
    def overlaid(text):
        return yaml.safe_dump(deep_update(yaml.safe_load(text), change))

    with edited_in_place((ws / "config" / "test.yaml", overlaid)):
        return run_snakemake(ws, *args)


PACKAGE = Path("workflow") / "scripts" / "qwen3_pilot"

# docs/reruns.md's code edits, by their row: the file and how it is edited. A semantic edit changes a message the
# gate writes, or adds a statement; the last row's edits change only what does not run.
CODE_EDITS = {
    "the loaded-weights gate (`stages/train_judging.py`)": [
        (PACKAGE / "stages" / "train_judging.py", lambda text: text.replace('"the weights did not load"',
                                                                             '"the weights did not load (edited)"'))],
    "the recipe builder (`titan/in_ranks/recipes.py`)": [
        (PACKAGE / "titan" / "in_ranks" / "recipes.py", lambda text: text + "\nEDITED_FOR_A_TEST = True\n")],
    "a comment or docstring in any module of the package": [
        (PACKAGE / "stages" / "train_judging.py", lambda text: text.replace(
            "def loaded_weights_gate(", "# A comment added.\ndef loaded_weights_gate(")),
        (PACKAGE / "training.py", lambda text: text.replace('"""', '"""Reworded. ', 1))],
}


def code_table_rows() -> dict[str, set[str]]:
    """The code edits' table: {the edit as the row says it: the jobs planned}."""
    return section_table("What reruns after a code edit")


@pytest.mark.parametrize("edit", list(CODE_EDITS))
def test_each_code_edit_plans_the_jobs_docs_reruns_md_lists(completed_run, tmp_path, edit):
    """Code is an input: a judge edit plans the judges and what reads their verdicts, a recipe edit fail_fast and
    the training, and an edit to nothing that runs (a comment, a docstring) plans nothing. An edit that reruns
    fail_fast is planned past it on a copy of the run (planned_past_fail_fast records a run of it)."""
    assert set(code_table_rows()) == set(CODE_EDITS)
    edits = [(completed_run / path, change) for path, change in CODE_EDITS[edit]]
    for path, change in edits:
        assert change(path.read_text()) != path.read_text(), path  # the edit applies
    with edited_in_place(*edits):
        result = run_snakemake(completed_run, "-n")
    assert result.returncode == 0, output(result)[-3000:]
    planned, printed = planned_job_labels(result), output(result)
    if "fail_fast" in planned:
        ws = copy_run(completed_run, tmp_path / "ws")
        for path, change in CODE_EDITS[edit]:
            (ws / path).write_text(change((ws / path).read_text()))
        planned, printed = planned_past_fail_fast(ws)
    assert planned == code_table_rows()[edit], printed[-3000:]


def bump_table_rows() -> dict[str, set[str]]:
    """The table of pin bumps that change no fetched byte: {package: the jobs that run}."""
    return {package.strip("`"): jobs
            for package, jobs in section_table("What reruns after a bump that fetches the same bytes").items()}


def respell_pin(ws: Path, package: str) -> None:
    """The package's pin in workflow/envs/cpu.txt with one more `.0` (0.8.0 -> 0.8.0.0): the same version to pip (PEP
    440 pads with zeros), so what is installed still passes the package's stamp, but another pin to Snakemake, so the
    stamp reruns: a release whose client fetches the same bytes, as `make lock` would bring in."""
    pins = ws / "workflow" / "envs" / "cpu.txt"
    pin = re.search(rf"^{re.escape(package)}==\S+$", pins.read_text(), re.M).group(0)
    pins.write_text(pins.read_text().replace(pin, pin + ".0"))


@started_ahead
def test_a_bump_that_fetches_the_same_bytes_reruns_no_consumer_of_the_weights(ws, scratch):
    """Reruns stop where the bytes stop changing: fetch_weights is a checkpoint and its consumers read its manifest
    (content only), so after a huggingface-hub bump the whole run refetches and trains nothing (the report says
    each consumer was reused by content), and after a safetensors bump moe_reduced, which does not use
    safetensors, stays as it was. The safetensors case is run up to fetch_weights, then planned past fail_fast
    (planned_past_fail_fast; test_training_e2e's transformers pin change runs fail_fast again for real and sees the
    other recipe's stages stay)."""
    rows = bump_table_rows()
    assert set(rows) == {"huggingface-hub", "safetensors"}
    respell_pin(ws, "huggingface-hub")
    ran = run_snakemake(ws, "--cores", "2", "results/report.html", env=AHEAD_ENV)
    assert ran.returncode == 0, output(ran)[-3000:]
    assert planned_job_labels(ran) == rows["huggingface-hub"], output(ran)[-3000:]
    invocation = json.loads((ws / "results" / "report.json").read_text())["changes"]["invocation"]
    for stage in ("train_hf", "train_native", "moe_reduced", "benchmark", "export_reload"):
        assert invocation["stages"][stage]["reasons"][0].startswith(REUSED_BY_CONTENT), invocation["stages"][stage]
    assert set(invocation["ran"]) == {"pin_env", "fetch_weights"}

    respell_pin(ws, "safetensors")
    fetched = run_snakemake(ws, "--cores", "2", "results/fetch_weights/summary.json", env=AHEAD_ENV)
    assert fetched.returncode == 0, output(fetched)[-3000:]
    planned, printed = planned_past_fail_fast(ws, env=AHEAD_ENV)
    assert planned_job_labels(fetched) | planned == rows["safetensors"], printed[-3000:]


def test_the_table_has_the_edits_the_issue_names():
    edits = {edit.split(":")[0] for edit, _ in table_rows()}
    assert {"training.gate.min_gap", "kernels.loss_tolerance",
            "training.accepted_differences.train_hf.max_position_embeddings"} <= edits


@started_ahead
def test_each_edit_plans_the_jobs_docs_reruns_md_lists(ws, scratch):
    """Each config edit of the table, made alone to a copy of the finished run, plans exactly the jobs its row lists.
    In the background (a dry run per row, about fourteen Snakemake starts, and three more for a row that reruns
    fail_fast) on its own copy, so it edits the copy's test.yaml directly; every row that differs is named."""
    overlay = ws / "config" / "test.yaml"
    original = overlay.read_text()
    differing = []
    for edit, jobs in table_rows():
        overlay.write_text(yaml.safe_dump(deep_update(yaml.safe_load(original), as_overlay(edit))))
        planned, printed = planned_past_fail_fast(ws, env=AHEAD_ENV)
        overlay.write_text(original)
        if "fail_fast" in planned:  # its run recorded with the edit: recorded again without it, for the next rows
            record_fail_fast_run(ws, AHEAD_ENV)
        if planned != jobs:
            differing.append(f"{edit}: planned {sorted(planned)}, docs/reruns.md lists {sorted(jobs)}\n"
                             f"{printed[-1500:]}")
    assert not differing, "\n\n".join(differing)


@dataclass
class GateRuns:
    """The shared run's copy, failed by a gate threshold above both measured gaps, then passed again with the
    threshold back: what each invocation printed and left."""

    gap: float
    failed: subprocess.CompletedProcess
    failed_report: dict
    failed_page: Path
    passed: subprocess.CompletedProcess
    passed_report: dict


@pytest.fixture(scope="module")
def gate_runs(completed_run, tmp_path_factory) -> GateRuns:
    ws = copy_run(completed_run, tmp_path_factory.mktemp("gate") / "ws")
    results = ws / "results"
    gap = max(json.loads((results / stage / "summary.json").read_text())["figures"]["gate"]["gap"]
              for stage in ("train_hf", "train_native"))
    # --keep-going: both judges run, as a reviewer would want both verdicts of one threshold.
    failed = with_overlay(ws, {"training": {"gate": {"min_gap": gap + 1.0}}}, "--cores", "2", "--keep-going",
                          "results/report.html")
    failed_report = json.loads((results / "report.json").read_text())
    failed_page = shutil.copy(results / "report.html", ws.parent / "failed-report.html")
    passed = run_snakemake(ws, "--cores", "2", "results/report.html")
    return GateRuns(gap, failed, failed_report, Path(failed_page), passed,
                    json.loads((results / "report.json").read_text()))


def test_a_gate_threshold_past_the_measured_gap_fails_the_report_then_passes_again_without_training(gate_runs):
    """The verdict follows the threshold: min_gap above both recipes' measured gaps fails both training stages
    (their judges) and the report leads with them; the threshold back, the same figures pass. Neither run
    trains."""
    gap, failed, passed = gate_runs.gap, gate_runs.failed, gate_runs.passed
    assert failed.returncode != 0
    stages = {stage["stage"]: stage for stage in gate_runs.failed_report["stages"]}
    assert stages["train_native"]["status"] == stages["train_hf"]["status"] == "fail"
    for stage in ("train_hf", "train_native"):
        assert f"training.gate.min_gap = {gap + 1.0}" in stages[stage]["figures"]["reason"]
        assert stages[stage]["figures"]["gate"]["gap"] < stages[stage]["figures"]["gate"]["min_gap"]
        assert len(stages[stage]["figures"]["steps"]) == 10  # every measured figure kept in the failure record
    for stage in ("compare_recipes", "export_reload"):
        assert stages[stage]["status"] == "not_run" and stages[stage]["notes"][0].startswith("blocked by train_")
    html = gate_runs.failed_page.read_text()
    assert "This run failed." in html and "loaded-weights gate failed" in html and "min_gap" in html
    assert passed.returncode == 0, output(passed)[-3000:]
    assert all(stage["status"] == "pass" for stage in gate_runs.passed_report["stages"])
    for result in (failed, passed):
        # The jobs each run started ("localrule train:" when Snakemake runs them itself).
        started = {rule for rule, _ in planned_job_blocks(result)}
        assert "judge" in started and not started & {"train", "moe_reduced", "benchmark"}, output(result)[-3000:]


@pytest.mark.chromium
@pytest.mark.usefixtures("chromium")
def test_the_failed_reports_first_screen_shows_the_failed_gates_against_the_threshold_and_what_they_blocked(
        gate_runs):
    from browser import open_page
    from report_page import FIRST_SCREEN

    with open_page(gate_runs.failed_page.as_uri(), 1400, 900) as page:
        screen = page.evaluate(FIRST_SCREEN)
    assert screen["verdict"] == "fail" and screen["verdict_bottom"] <= 900
    rows = {row["stage"]: row for row in screen["rows"]}
    assert all(row["bottom"] <= 900 for row in screen["rows"]), screen["rows"]
    threshold = f"needs >= {number(gate_runs.gap + 1.0)}"
    for stage in ("train_hf", "train_native"):
        assert rows[stage]["status"] == "fail" and "gap " in rows[stage]["figure"], rows[stage]
        assert f"nats, {threshold}" in rows[stage]["figure"], rows[stage]
    for stage in ("compare_recipes", "export_reload"):
        assert rows[stage]["status"] == "not_run" and rows[stage]["figure"].startswith("blocked by train_"), rows[stage]
