"""The report: built from the stage summaries only, not-built stages shown as not_run, HTML escaped."""

from __future__ import annotations

import json
import re

import pytest
from report_page import too_precise, visible_text

from qwen3_pilot.pilot_report import NO_SUMMARY, overall_status
from qwen3_pilot.pilot_report import titles as report_titles
from qwen3_pilot.stages import STAGES
from qwen3_pilot.stages.report import run as build_report
from qwen3_pilot.summary import StageSummary

CONFIG = {"backend": "cpu", "ranks": 2, "weights": {"source": "fixture", "repo_id": "pilot-fixture/tiny-qwen3"},
          "report": {"baseline": None}, "training": {"steps": 10}, "moe": {"layers": 4, "experts": 64, "top_k": 4},
          "plan": {"world_size": 64, "flavor": "4B"}, "convergence": {"steps": 100},
          "fail_fast": {"steps": 2, "ranks": 2}}


def write_summary(folder, stage, status="pass", **fields):
    path = folder / f"{stage}.json"
    StageSummary(stage=stage, status=status, backend="cpu", **fields).write(path)
    return path


def build(tmp_path, summaries, config=CONFIG):
    return build_report(
        summaries=summaries, config=config, config_digest="d" * 64, workflow_dir=tmp_path,
        html_path=tmp_path / "report.html", json_path=tmp_path / "report.json",
    )


def test_stage_titles_take_their_figures_from_the_config():
    titles = report_titles(CONFIG)
    assert titles["train_native"] == "Train the native torchtitan 4B recipe (10 steps)"
    assert titles["moe_reduced"] == "Train the reduced MoE (4 layers, 64 experts, top-4)"
    assert titles["verify_ranks"] == "Verify the 2 ranks and the 64-rank plan of Qwen3-4B"
    assert titles["convergence"] == "Convergence: the native recipe 100 steps, its held-out loss"
    assert report_titles({**CONFIG, "training": {"steps": 3}})["train_hf"].endswith("(3 steps)")


def test_stages_without_a_summary_are_not_run_never_pass(tmp_path):
    report = build(tmp_path, {"pin_env": write_summary(tmp_path, "pin_env", figures={"packages": []})})
    by_stage = {s["stage"]: s for s in report["stages"]}
    assert [s["stage"] for s in report["stages"]] == [name for name, _ in STAGES]
    assert by_stage["pin_env"]["status"] == "pass"
    for stage in ("train_native", "train_hf", "export_reload", "kernel_numerics", "moe_reduced", "benchmark"):
        assert by_stage[stage]["status"] == "not_run"
        assert by_stage[stage]["notes"] == [NO_SUMMARY]
    assert report["status"] == "incomplete"
    on_disk = json.loads((tmp_path / "report.json").read_text())
    assert on_disk["provenance"]["config_digest"] == "d" * 64
    assert on_disk["provenance"]["commit"]


def test_a_cpu_report_says_first_that_it_is_a_rehearsal_with_the_stand_ins_sizes(tmp_path):
    report = build(tmp_path, {
        "fetch_weights": write_summary(tmp_path, "fetch_weights", figures={"parameters_stored": 754_560}),
        "moe_reduced": write_summary(tmp_path, "moe_reduced", figures={"parameters": 1_234_567}),
    })
    assert report["title"] == "Qwen3 pilot, CPU rehearsal: audit trail (tiny stand-in models, no Trainium figure)"
    assert report["caveat"].startswith("CPU rehearsal: tiny stand-in models with the real architectures (dense Qwen3 "
                                       "754,560 parameters; reduced MoE 1,234,567 parameters) on gloo ranks.")
    assert "no figure on this page is a Trainium figure" in report["caveat"]
    text = visible_text((tmp_path / "report.html").read_text())
    # The title, then the caveat: the first two things on the page.
    assert text.index(report["title"]) < text.index("CPU rehearsal: tiny stand-in") < text.index("Verdict")
    neuron = build(tmp_path, {}, {**CONFIG, "backend": "neuron", "ranks": 64})
    assert neuron["title"] == "Qwen3 on AWS Trainium (trn2): pilot audit trail" and neuron["caveat"] is None


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
    # The naming column first; built and checkpoint echo config.json values, shown exactly as recorded.
    assert "<caption>parity</caption>\n<tr><th>field</th><th>built</th><th>checkpoint</th><th>verdict</th></tr>" in html
    assert ('<td>rope_theta</td><td class="exact">1000000.0</td><td class="exact">5000000.0</td>'
            "<td>MISMATCH &lt;b&gt;</td>") in html


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
    assert ('<img alt="loss per step of the training stages, with their controls" '
            'src="data:image/png;base64,iVBOR' in html)
    build(tmp_path, {})
    assert "data:image/png" not in (tmp_path / "report.html").read_text()


def test_the_report_matches_its_versioned_schema_and_a_broken_one_is_named(tmp_path):
    import jsonschema

    from qwen3_pilot.pilot_report import REPORT_SCHEMA, SCHEMA_VERSION, check_schema

    report = build(tmp_path, {"pin_env": write_summary(tmp_path, "pin_env", figures={"packages": []})})
    schema = json.loads(REPORT_SCHEMA.read_text())
    jsonschema.validate(json.loads((tmp_path / "report.json").read_text()), schema)
    assert report["schema_version"] == SCHEMA_VERSION and report["provenance"]["host"]
    report["stages"][0]["status"] = "passed"
    with pytest.raises(ValueError, match="report.json does not match .*report.schema.json at stages/0/status"):
        check_schema(report)


def test_the_page_may_load_nothing_from_elsewhere(tmp_path):
    """A Content-Security-Policy keeps the page self-contained in any browser: inline style, data: images."""
    build(tmp_path, {})
    html = (tmp_path / "report.html").read_text()
    assert ('<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; img-src data:; '
            "style-src 'unsafe-inline'\">") in html
    assert "<script" not in html and "http://" not in html and "https://" not in html


# ---- after a failed run: the report from what is on disk ----


def test_a_failed_stage_shows_its_figures_and_blocks_what_depends_on_it(tmp_path, monkeypatch):
    from qwen3_pilot.pilot_report import build_failed_report
    from qwen3_pilot.summary import write_failure

    monkeypatch.chdir(tmp_path)
    for stage in ("pin_env", "fetch_corpus", "fixture_checkpoint", "fetch_weights", "verify_ranks", "train_hf",
                  "compare_recipes", "kernel_numerics"):
        (tmp_path / "results" / stage).mkdir(parents=True)
        write_summary(tmp_path / "results" / stage, stage).rename(tmp_path / "results" / stage / "summary.json")
    write_failure("train_native", RuntimeError("loaded-weights gate failed"), tmp_path / "x.log", tmp_path / "y.log",
                  {"gate": {"gap": 0.01, "min_gap": 1.0}})
    report = build_failed_report(config=CONFIG, config_digest="d" * 64, workflow_dir=tmp_path,
                                 results=tmp_path / "results", run_started="2000-01-01T00:00:00.000+00:00")
    by_stage = {s["stage"]: s for s in report["stages"]}
    assert report["status"] == "fail" and report["failed_run"]
    native = by_stage["train_native"]
    assert native["status"] == "fail" and native["figures"]["gate"] == {"gap": 0.01, "min_gap": 1.0}
    assert "loaded-weights gate failed" in native["figures"]["reason"]
    # compare_recipes' summary on disk is an earlier run's: it depends on the failed stage, so it is not shown.
    for stage in ("compare_recipes", "export_reload"):
        assert by_stage[stage]["status"] == "not_run"
        assert by_stage[stage]["notes"] == ["blocked by train_native, which failed"]
    assert by_stage["train_hf"]["status"] == "pass" and by_stage["kernel_numerics"]["status"] == "pass"
    assert by_stage["moe_reduced"]["notes"] == ["not reached: the run stopped at a failure"]
    assert by_stage["benchmark"]["notes"] == ["not reached: the run stopped at a failure"]
    html = (tmp_path / "results" / "report.html").read_text()
    assert "This run failed." in html and "FAILED RUN" in html
    # Dated 1970: Snakemake must take it as out of date, or the next run would keep it as the report.
    assert (tmp_path / "results" / "report.html").stat().st_mtime == 0


def test_a_failure_blocks_every_stage_downstream_of_it_however_far(tmp_path, monkeypatch):
    """fetch_corpus failed: what reads the corpus and everything after it is blocked, the stages that read it
    only through others too (fetch_weights through the fixture, compare_recipes through the recipes, kernel_numerics
    through fail_fast); verify_ranks, which reads none of it, is not."""
    from qwen3_pilot.pilot_report import build_failed_report
    from qwen3_pilot.summary import write_failure

    monkeypatch.chdir(tmp_path)
    for stage in ("pin_env", "verify_ranks"):
        (tmp_path / "results" / stage).mkdir(parents=True)
        write_summary(tmp_path / "results" / stage, stage).rename(tmp_path / "results" / stage / "summary.json")
    write_failure("fetch_corpus", RuntimeError("checksum mismatch"), tmp_path / "x.log", tmp_path / "y.log", {})
    report = build_failed_report(config=CONFIG, config_digest="d" * 64, workflow_dir=tmp_path,
                                 results=tmp_path / "results", run_started="2000-01-01T00:00:00.000+00:00")
    notes = {s["stage"]: s["notes"] for s in report["stages"] if s["status"] == "not_run"}
    blocked = {stage for stage, note in notes.items() if note == ["blocked by fetch_corpus, which failed"]}
    assert blocked == {"fixture_checkpoint", "fetch_weights", "fail_fast", "train_hf", "train_native",
                       "compare_recipes", "convergence", "export_reload", "kernel_numerics", "moe_reduced", "benchmark"}
    assert {s["stage"]: s["status"] for s in report["stages"]}["verify_ranks"] == "pass"


def test_a_later_summary_of_the_stage_removes_its_failure_record(tmp_path, monkeypatch):
    from qwen3_pilot.summary import failure_path, write_failure

    monkeypatch.chdir(tmp_path)
    write_failure("train_native", RuntimeError("x"), tmp_path / "x.log", tmp_path / "y.log", {})
    assert failure_path("train_native").exists()
    StageSummary(stage="train_native", status="pass", backend="cpu").write(tmp_path / "summary.json")
    # The record and the sha256 written beside it, both: nothing is left in results/failures/.
    assert list(failure_path("train_native").parent.iterdir()) == []


def test_the_dependency_map_is_snakemakes_job_graph():
    """report.UPSTREAM against `snakemake --dag`, each job taken as its stage (stage_of_job: pin_package's stamps
    count as pin_env, train and judge as the stage their {stage} names)."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    from conftest import PROJECT

    from qwen3_pilot.stages import UPSTREAM, stage_of_job

    snakemake = str(Path(sys.executable).with_name("snakemake"))
    dot = subprocess.run([snakemake, "--dag", "--forceall", "results/report.html"], cwd=PROJECT, capture_output=True,
                         text=True, check=True).stdout
    jobs = {node: (rule, dict(re.findall(r"\\n(\w+): ([\w.-]+)", rest)))
            for node, rule, rest in re.findall(r'^\s*(\d+)\[label = "(\w+)((?:\\n[^"]*)?)"', dot, re.M)}
    edges = re.findall(r"^\s*(\d+) -> (\d+)", dot, re.M)
    # The judges, compare_recipes and export_reload wait for a checkpoint only to be planned again after it
    # (replanned_after_checkpoints in workflow/rules/common.smk): they read nothing of it.
    replanned_only = {("fetch_weights", "judge"), ("fetch_weights", "compare_recipes"), ("fail_fast", "judge"),
                      ("fail_fast", "compare_recipes"), ("fail_fast", "export_reload")}
    edges = [(source, target) for source, target in edges if (jobs[source][0], jobs[target][0]) not in replanned_only]
    stage = {node: stage_of_job(rule, wildcards) for node, (rule, wildcards) in jobs.items()}
    # Snakemake leaves some wildcard values out of a job's label: a judge's stage is then its one input's.
    for source, target in edges:
        if stage[target] == "judge":
            stage[target] = stage[source]
    graph: dict[str, set[str]] = {}
    for source, target in edges:
        if stage[source] != stage[target]:
            graph.setdefault(stage[target], set()).add(stage[source])
    for name, upstream in UPSTREAM.items():
        assert set(upstream) == graph.get(name, set()), name


def test_a_failure_record_of_an_earlier_run_is_not_this_runs_failure(tmp_path, monkeypatch):
    from qwen3_pilot.pilot_report import build_failed_report
    from qwen3_pilot.summary import write_failure

    monkeypatch.chdir(tmp_path)
    write_failure("train_native", RuntimeError("an old failure"), tmp_path / "x.log", tmp_path / "y.log", {})
    report = build_failed_report(config=CONFIG, config_digest="d" * 64, workflow_dir=tmp_path,
                                 results=tmp_path / "results", run_started="2999-01-01T00:00:00.000+00:00")
    by_stage = {s["stage"]: s for s in report["stages"]}
    assert by_stage["train_native"]["status"] == "not_run"
    assert "failed in an earlier run" in by_stage["train_native"]["notes"][0]
    assert by_stage["compare_recipes"]["notes"] == ["not reached: the run stopped at a failure"]


def test_the_environment_section_shows_the_lock_digest_platform_and_whether_the_run_was_locked(tmp_path):
    environment = {"python": "3.11.7", "platform": "Linux-x86_64-with-glibc2.36", "machine": "x86_64"}
    lock = {"file": "workflow/envs/cpu.lock", "sha256": "b" * 64, "packages": 181, "drift": [],
            "locked_environment": True}
    summary = write_summary(tmp_path, "pin_env", figures={
        "pins_file": "workflow/envs/cpu.txt", "packages": [], "lock": lock, "environment": environment, "system": {}})
    report = build(tmp_path, {"pin_env": summary})
    assert report["environment"]["lock"]["sha256"] == "b" * 64
    html = (tmp_path / "report.html").read_text()
    assert "Hash lock workflow/envs/cpu.lock, sha256" in html and "b" * 64 in html and "181 packages" in html
    assert "locked environment: <span class=\"status pass\">yes</span>" in html
    assert "on Linux-x86_64-with-glibc2.36 (x86_64, Python 3.11.7)" in html
    unlocked = write_summary(tmp_path, "pin_env", figures={
        "pins_file": "workflow/envs/neuron.txt", "packages": [], "lock": {"file": None, "locked_environment": False},
        "environment": environment, "system": {}})
    build(tmp_path, {"pin_env": unlocked})
    assert "No hash lock for this backend" in (tmp_path / "report.html").read_text()


def headed_runs(section):
    """(recipe, its runs) per heading of the page's benchmark section, from the runs table under it."""
    found = []
    for recipe, table in re.findall(r'<h4 class="recipe">(.*?)</h4>\s*<div class="scroll"><table>\s*'
                                    r"(<caption>table</caption>.*?</table>)", section, re.S):
        columns = re.findall(r"<th>(.*?)</th>", table)
        rows = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(<td.*?)</tr>", table, re.S)]
        assert "recipe" not in columns  # the heading names it
        found.append((recipe, [row[columns.index("run")] for row in rows]))
    return found


def test_the_benchmark_shows_one_headed_table_per_recipe_and_leaves_the_step_times_to_its_plot(tmp_path):
    """Each recipe under its own heading with its runs as rows (and its cost row), the recipe column gone;
    the per-step times drawn, not tabled, and kept in report.json; every value escaped."""
    rows = [{"recipe": recipe, "run": run, "median_step_s": 0.2, "noisy": False}
            for recipe, runs in (("train_native", ("eager", "compiled_cold")), ("moe_reduced", ("eager", "plain")))
            for run in runs]
    rows[-1]["noisy"] = "<b>loud</b>"
    step_times = [{"recipe": row["recipe"], "run": row["run"], "step": step, "phase": "steady", "step_time_s": 0.2}
                  for row in rows for step in (1, 2, 3)]
    figures = {"table": rows, "step_times": step_times, "warmup_steps": 1, "compile": "no compile recipe",
               "cost": [{"recipe": "moe_reduced", "per_million_tokens": 1.5}]}
    report = build(tmp_path, {"benchmark": write_summary(tmp_path, "benchmark", figures=figures)})
    html = (tmp_path / "report.html").read_text()
    section = html[html.index('<div id="benchmark">'):]
    section = section[:section.index("</details>")]
    assert headed_runs(section) == [("train_native", ["eager", "compiled_cold"]), ("moe_reduced", ["eager", "plain"])]
    assert section.count("<caption>cost</caption>") == 1 and "no compile recipe" in section
    assert "&lt;b&gt;loud&lt;/b&gt;" in section and "<b>loud</b>" not in section
    assert "step_times: drawn in the plot above" in section and "<th>step_times</th>" not in section
    assert "<th>phase</th>" not in section  # no table of the per-step rows
    benchmark = next(stage for stage in report["stages"] if stage["stage"] == "benchmark")
    assert benchmark["figures"]["step_times"] == step_times


def test_every_figure_on_the_page_is_readable_and_no_json_is_shown(tmp_path):
    """Raw floats, big counts and nested records go in; the page shows each with the digits that fit it (exact
    values aside) and no record as JSON text. report.json keeps every raw value."""
    figures = {"peak_flops_per_rank": 37448974629.32509, "final_loss": 0.5289831917902781, "parameters": 1906330624,
               "plan": {"architecture": {"dim": 2560}, "static_gib_per_rank": 0.9365234375, "fits": True},
               "steps": [{"step": 1, "loss": 5.459681510925293, "extra": {"grad_norm": 1.9321751594543457}}],
               "source_sha256": "0123456789" * 6 + "abcd", "tolerance": 1.0000000000000001e-05}
    report = build(tmp_path, {"fetch_corpus": write_summary(tmp_path, "fetch_corpus", figures=figures)})
    html = (tmp_path / "report.html").read_text()
    assert too_precise(visible_text(html, skip_exact=True)) == []
    assert '{"' not in visible_text(html) and "{&#34;" not in html
    assert "0123456789" * 6 + "abcd" in visible_text(html) and "1e-05" in visible_text(html)
    assert "plan &gt; static per rank (GiB)</th><td>0.937</td>" in html
    stage = next(stage for stage in report["stages"] if stage["stage"] == "fetch_corpus")
    assert stage["figures"]["final_loss"] == 0.5289831917902781


def test_the_finished_runs_page_is_readable(completed_run):
    html = (completed_run / "results" / "report.html").read_text()
    assert too_precise(visible_text(html, skip_exact=True)) == []
    assert '{"' not in visible_text(html)
