"""Changes since a baseline: which stages ran and why (from Snakemake's plan), which figures moved, the
environment difference, and which baseline is used (config path, or the last approved sign-off's copy)."""

from __future__ import annotations

import json

import pytest

from qwen3_pilot.audit import record_written_report, signoff
from qwen3_pilot.changes import (
    BaselineError,
    baseline_changes,
    changes_since_baseline,
    environment_changes,
    figure_changes,
    find_baseline,
    flatten,
    headline,
    stage_runs,
)
from qwen3_pilot.parse_time.config import config_problems
from qwen3_pilot.parse_time.plan import read_plan, record_plan


def stage(name, status="pass", figures=None, artifacts=()):
    return {"stage": name, "status": status, "figures": figures or {},
            "artifacts": [{"path": p, "sha256": d} for p, d in artifacts]}


def environment(transformers="5.16.0"):
    return {"packages": [{"package": "torch", "pinned": "==2.14.1", "installed": "2.14.1", "ok": True},
                         {"package": "transformers", "pinned": f"=={transformers}", "installed": transformers,
                          "ok": True}],
            "environment": {"python": "3.11.7"}, "system": {}}


def report(stages, transformers="5.16.0", commit="abc"):
    return {"status": "pass", "backend": "cpu", "stages": stages, "environment": environment(transformers),
            "config": {"training": {"steps": 10}},
            "provenance": {"commit": commit, "dirty": False, "config_digest": "d" * 64}}


# A transformers bump as Snakemake plans it: the package's stamp, pin_env, and the stages that use it.
PLAN_JOBS = [
    ("pin_package", {"package": "transformers"}, "Params have changed since last execution: pinned"),
    ("pin_env", {}, "Input files updated by another job: results/pin_env/packages/transformers.json"),
    ("train_hf", {}, "Input files updated by another job: results/pin_env/packages/transformers.json"),
    ("compare_recipes", {}, "Input files updated by another job: results/train_hf/summary.json"),
    ("export_reload", {}, "Input files updated by another job: results/train_hf/summary.json"),
    ("report", {}, "Input files updated by another job: results/train_hf/summary.json"),
]
STAGES = ["pin_env", "train_hf", "train_native", "compare_recipes", "export_reload"]


def test_the_plan_tells_which_stages_ran_with_snakemakes_reasons(tmp_path):
    plan = record_plan(PLAN_JOBS, "2026-12-03T10:00:00.000+00:00", tmp_path / "invocation.json")
    assert read_plan(tmp_path / "invocation.json") == plan
    runs = stage_runs(plan, [stage(name) for name in STAGES] + [stage("benchmark", "not_run")])
    assert runs["ran"] == ["pin_env", "train_hf", "compare_recipes", "export_reload"]
    assert runs["reused"] == ["train_native"]
    assert runs["stages"]["pin_env"]["reasons"][0] == (
        "pin_package[transformers]: Params have changed since last execution: pinned")
    assert "benchmark" not in runs["stages"]  # a stage that did not run is neither ran nor reused


def test_a_planned_stage_whose_record_predates_the_invocation_was_reused_by_content(tmp_path):
    """A hub bump plans fetch_weights' consumers; once it has run, Snakemake drops those whose inputs came out
    byte-identical, and their records stay from before this invocation."""
    jobs = [("fetch_weights", {}, "Input files updated by another job: results/pin_env/packages/huggingface-hub.json"),
            ("train", {"stage": "train_hf"}, "Input files updated by another job: results/fetch_weights/checkpoint"),
            ("report", {}, "Input files updated by another job: results/fetch_weights/summary.json")]
    plan = record_plan(jobs, "2026-12-03T10:00:00.000+00:00", tmp_path / "invocation.json")
    before, during = "2026-12-03T09:59:59.999+00:00", "2026-12-03T10:00:00.000+00:00"
    runs = stage_runs(plan, [dict(stage("fetch_weights"), started=during), dict(stage("train_hf"), started=before)])
    assert runs["ran"] == ["fetch_weights"] and runs["reused"] == ["train_hf"]
    assert runs["stages"]["train_hf"]["reasons"] == [
        "reused: inputs unchanged by content (planned at the start on: train[train_hf]: Input files updated by "
        "another job: results/fetch_weights/checkpoint)"]


def test_a_plan_that_does_not_plan_the_report_is_not_this_reports(tmp_path):
    record_plan(PLAN_JOBS[:-1], "2026-12-03T10:00:00.000+00:00", tmp_path / "invocation.json")
    assert read_plan(tmp_path / "invocation.json") is None
    assert read_plan(tmp_path / "absent.json") is None
    runs = stage_runs(None, [stage("train_hf")])
    assert not runs["recorded"] and "not recorded" in runs["note"]


def test_records_in_lists_are_named_by_their_keys_and_number_changes_are_measured():
    before = {"steps": [{"step": 1, "loss": 5.0, "step_time_s": 1.0}, {"step": 2, "loss": 4.0, "step_time_s": 0.5}],
              "shape": [2, 256], "note": "same"}
    now = {"steps": [{"step": 1, "loss": 5.0, "step_time_s": 0.8}, {"step": 2, "loss": 4.5, "step_time_s": 0.5}],
           "shape": [2, 512], "note": "same", "new": 1}
    assert "steps[step=2].loss" in flatten(before) and flatten(before)["shape"] == [2, 256]
    moved = {c["figure"]: c for c in figure_changes(before, now)}
    assert set(moved) == {"steps[step=1].step_time_s", "steps[step=2].loss", "shape", "new"}
    assert moved["steps[step=2].loss"]["change"] == pytest.approx(0.5)
    assert moved["steps[step=2].loss"]["relative"] == pytest.approx(0.125)
    assert not moved["steps[step=2].loss"]["volatile"] and moved["steps[step=1].step_time_s"]["volatile"]
    assert moved["new"]["before"] == "(absent)"
    assert "change" not in moved["shape"]
    numerics = [{"section": "rope", "op": "fwd", "dtype": "float32", "max_abs_diff": 0.0},
                {"section": "rope", "op": "fwd", "dtype": "bfloat16", "max_abs_diff": 0.0}]
    bench = [{"recipe": "train_native", "run": "eager", "median_step_s": 0.2}]
    assert set(flatten({"table": bench})) == {"table[recipe=train_native,run=eager].median_step_s"}
    assert set(flatten({"numerics": numerics})) == {"numerics[section=rope,op=fwd,dtype=float32].max_abs_diff",
                                                    "numerics[section=rope,op=fwd,dtype=bfloat16].max_abs_diff"}


def test_a_stage_with_a_table_of_figure_kinds_is_read_from_it_and_the_others_by_name():
    """The benchmark's `cv`, `noisy` and cost `warmup` carry no unit in their names: its table says they are
    timings. Another stage's figures are read by name. Its raw per-step times are not compared at all, and a
    figure present on one side only (a run dropped) moves whatever its kind."""
    from qwen3_pilot.changes import STABLE, TIMING, figure_kind, figure_name

    assert figure_name("numerics[section=rope,shape=[2, 256]].max_abs_diff") == "numerics.max_abs_diff"
    assert figure_kind("benchmark", "table[recipe=moe_reduced,run=eager].cv") == TIMING
    assert figure_kind("benchmark", "cost[recipe=moe_reduced].warmup") == TIMING
    assert figure_kind("benchmark", "table[recipe=moe_reduced,run=eager].steady_steps") == STABLE
    assert figure_kind("benchmark", "warmup_steps") == STABLE
    assert figure_kind("train_hf", "mean_step_time_s_after_step_1") == TIMING
    assert figure_kind("train_hf", "cv") == STABLE
    row = {"recipe": "moe_reduced", "run": "eager", "cv": 0.01, "noisy": False, "steady_steps": 3}
    before = {"table": [row, {**row, "run": "plain"}], "warmup_steps": 2,
              "step_times": [{"recipe": "moe_reduced", "run": "eager", "step": 1, "step_time_s": 9.0}]}
    now = {"table": [{**row, "cv": 0.5, "noisy": True}], "warmup_steps": 2,
           "step_times": [{"recipe": "moe_reduced", "run": "eager", "step": 1, "step_time_s": 7.0}]}
    moved = {c["figure"]: c["volatile"] for c in figure_changes(before, now, "benchmark")}
    eager, plain = "table[recipe=moe_reduced,run=eager]", "table[recipe=moe_reduced,run=plain]"
    assert moved == {f"{eager}.cv": True, f"{eager}.noisy": True,
                     f"{plain}.cv": False, f"{plain}.noisy": False, f"{plain}.steady_steps": False}


def test_a_transformers_bump_shows_the_moved_figures_environment_and_artifacts():
    baseline = report([stage("train_hf", figures={"final_loss": 4.98, "mean_step_time_s_after_step_1": 0.11},
                             artifacts=[("results/train_hf/export/model.safetensors", "a" * 64)]),
                       stage("train_native", figures={"final_loss": 4.98}, artifacts=[("x", "b" * 64)])])
    now = report([stage("train_hf", figures={"final_loss": 4.90, "mean_step_time_s_after_step_1": 0.12},
                        artifacts=[("results/train_hf/export/model.safetensors", "c" * 64)]),
                  stage("train_native", figures={"final_loss": 4.98}, artifacts=[("x", "b" * 64)])],
                 transformers="5.17.0", commit="def")
    changes = baseline_changes(now, baseline)
    hf, native = changes["stages"]["train_hf"], changes["stages"]["train_native"]
    assert [c["figure"] for c in hf["figures_moved"]] == ["final_loss"]
    assert [c["figure"] for c in hf["timing_figures_moved"]] == ["mean_step_time_s_after_step_1"]
    assert hf["artifacts_changed"] == ["results/train_hf/export/model.safetensors"]
    assert not native["figures_moved"] and not native["artifacts_changed"]
    assert {(r["what"], r["before"], r["now"]) for r in changes["environment"]} == {
        ("transformers (pinned)", "==5.16.0", "==5.17.0"), ("transformers (installed)", "5.16.0", "5.17.0")}
    assert changes["provenance"] == [{"what": "commit", "before": "abc", "now": "def"}]
    assert changes["config"] == []


def test_the_headline_reads_what_reran_what_was_reused_and_what_moved(tmp_path):
    baseline_path = tmp_path / "baseline.json"
    baseline_path.write_text(json.dumps(report([stage(n, figures={"loss": 5.0}) for n in STAGES])))
    now = report([stage(n, figures={"loss": 4.0 if n == "train_hf" else 5.0}) for n in STAGES])
    plan = record_plan(PLAN_JOBS, "2026-12-03T10:00:00.000+00:00", tmp_path / "invocation.json")
    changes = changes_since_baseline(now, plan, str(baseline_path), tmp_path, tmp_path / "signoffs.jsonl")
    assert changes["headline"] == ("pin_env, train_hf, compare_recipes, export_reload reran; train_native reused; "
                                   "figures moved in train_hf (1).")
    assert changes["baseline"]["source"] == "config report.baseline"


@pytest.fixture
def signed(tmp_path):
    """A workflow folder whose results/report.json was approved, then replaced by a newer run's."""
    results = tmp_path / "results"
    results.mkdir()
    (results / "report.json").write_text(json.dumps(report([stage("train_hf")])))
    (results / "report.html").write_text("<html></html>")
    record_written_report(results / "report.json")  # only a report the workflow wrote can be approved
    record = signoff(results / "report.json", "Ada", "approve", "first")
    (results / "report.json").write_text(json.dumps(report([stage("train_hf", figures={"loss": 1.0})])))
    return tmp_path, record


def test_the_default_baseline_is_the_last_approved_signoffs_copy(signed):
    folder, record = signed
    baseline, where = find_baseline(None, folder, folder / "signoffs" / "signoffs.jsonl", "cpu")
    assert where["sha256"] == record["report_sha256"] and where["signed_off"]["name"] == "Ada"
    assert baseline["stages"][0]["figures"] == {}
    signoff(folder / "results" / "report.json", "Bob", "reject", "no")  # a rejection is not a baseline
    latest = find_baseline(None, folder, folder / "signoffs" / "signoffs.jsonl", "cpu")
    assert latest[1]["sha256"] == record["report_sha256"]
    assert find_baseline(None, folder, folder / "elsewhere" / "signoffs.jsonl", "cpu") is None


def test_of_two_approvals_the_later_one_is_the_baseline(signed):
    folder, first = signed
    results, signoffs = folder / "results", folder / "signoffs" / "signoffs.jsonl"
    record_written_report(results / "report.json")
    second = signoff(results / "report.json", "Bob", "approve", "the rerun")
    assert second["report_sha256"] != first["report_sha256"]
    baseline, where = find_baseline(None, folder, signoffs, "cpu")
    assert where["sha256"] == second["report_sha256"] and where["signed_off"]["name"] == "Bob"
    assert baseline["stages"][0]["figures"] == {"loss": 1.0}


def test_a_trn2_run_is_never_baselined_on_a_cpu_approval(signed):
    folder, record = signed
    signoffs = folder / "signoffs" / "signoffs.jsonl"
    assert find_baseline(None, folder, signoffs, "neuron") is None
    # A sign-off recorded before sign-offs named their backend: the signed copy's backend decides.
    legacy = {key: value for key, value in record.items() if key != "backend"}
    signoffs.write_text(json.dumps(legacy) + "\n")
    assert find_baseline(None, folder, signoffs, "neuron") is None
    assert find_baseline(None, folder, signoffs, "cpu")[1]["sha256"] == record["report_sha256"]


def test_a_configured_baseline_of_another_backend_is_a_config_error(tmp_path, monkeypatch):
    from conftest import default_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "old.json").write_text(json.dumps(report([stage("train_hf")])))
    assert not config_problems(default_config({"report": {"baseline": "old.json"}}))
    trn2 = default_config({"report": {"baseline": "old.json"}, "backend": "neuron"})
    assert ("report.baseline = 'old.json': a report of the cpu backend; this run is on neuron, and a run is compared "
            "only with a run of its own backend") in config_problems(trn2)


def test_an_edited_copy_of_the_signed_report_is_not_used_as_baseline(signed):
    folder, record = signed
    copy = folder / "signoffs" / f"{record['report_sha256']}.json"
    copy.write_text(copy.read_text().replace('"pass"', '"fail"', 1))
    with pytest.raises(BaselineError, match=f"{copy}: the signed-off report's copy has sha256 .* recorded "
                                            f"{record['report_sha256']}"):
        find_baseline(None, folder, folder / "signoffs" / "signoffs.jsonl", "cpu")
    tolerant = changes_since_baseline(report([stage("train_hf")]), None, None, folder,
                                      folder / "signoffs" / "signoffs.jsonl", strict=False)
    assert tolerant["against_baseline"] is None and "The baseline was not used" in tolerant["headline"]


@pytest.mark.parametrize("content, message", [
    (None, "no such file"), ("{not json", "not readable as JSON"), ('{"stages": []}', "no provenance, environment"),
])
def test_a_configured_baseline_that_is_not_a_report_is_a_config_error(tmp_path, monkeypatch, content, message):
    from conftest import default_config

    monkeypatch.chdir(tmp_path)
    if content is not None:
        (tmp_path / "old.json").write_text(content)
    config = default_config({"report": {"baseline": "old.json"}})
    assert any(p.startswith("report.baseline = 'old.json'") and message in p for p in config_problems(config))


def test_a_neuron_sdk_switch_is_named_with_the_components_that_moved_and_leads_the_headline():
    from qwen3_pilot.changes import headline, sdk_release_change

    def environment(release, torch_neuronx, nki):
        return {"neuron_sdk": {"sdk_release": release, "components": [
            {"component": "torch-neuronx", "release": torch_neuronx}, {"component": "nki", "release": nki}]}}

    before, now = environment("2.33.0", "2.14.3.0.*", "0.7.0"), environment("2.34.0", "2.14.3.1.*", "0.7.0")
    assert sdk_release_change(before, now) == "Neuron SDK 2.33.0 -> 2.34.0 (torch-neuronx 2.14.3.0.* -> 2.14.3.1.*)"
    assert sdk_release_change(before, before) is None and sdk_release_change({}, now) is None
    rows = {row["what"]: (row["before"], row["now"]) for row in environment_changes(before, now)}
    assert rows == {"Neuron SDK": ("2.33.0", "2.34.0"),
                    "Neuron SDK component torch-neuronx": ("2.14.3.0.*", "2.14.3.1.*")}
    runs = {"recorded": True, "ran": ["verify_ranks"], "reused": []}
    changes = {"stages": {}, "neuron_sdk": sdk_release_change(before, now)}
    assert "; Neuron SDK 2.33.0 -> 2.34.0 (torch-neuronx" in headline(runs, changes)


def test_a_stage_whose_code_changed_since_the_baseline_is_named():
    """The code digest of a stage, and of a judged stage's measuring job, against the baseline's: a changed
    judge or measurement is named in the headline; a side that recorded no code (an older report) is unknown."""
    def coded(name, digest, measured=None):
        code = {"digest": digest, "commit": "c", "dirty": False}
        return {**stage(name), "code": {**code, "measured": {**code, "digest": measured}} if measured else code}

    baseline = report([coded("train_hf", "a" * 64, measured="b" * 64), coded("pin_env", "c" * 64),
                       stage("export_reload")])
    now = report([coded("train_hf", "a" * 64, measured="9" * 64), coded("pin_env", "c" * 64),
                  coded("export_reload", "d" * 64)])
    changes = baseline_changes(now, baseline)
    assert {name: s["code_changed"] for name, s in changes["stages"].items()} == {
        "train_hf": True, "pin_env": False, "export_reload": None}
    runs = stage_runs(None, now["stages"])
    assert "the code changed of train_hf;" in headline(runs, changes)
