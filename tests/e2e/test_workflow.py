"""End to end: the whole DAG on a small cpu config, its figures, then the caching guarantees on that run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import SHARED_RUN_EDIT, SNAKEMAKE, edited_in_place, output, planned_jobs, planned_stages, run_snakemake

from qwen3_pilot.stages import UPSTREAM

pytestmark = pytest.mark.e2e


def report(ws):
    return json.loads((ws / "results" / "report.json").read_text())


def test_report_holds_every_built_stage_as_pass(completed_run):
    stages = {s["stage"]: s for s in report(completed_run)["stages"]}
    for stage in UPSTREAM:  # every stage this workflow builds
        assert stages[stage]["status"] == "pass", stage
        assert stages[stage]["artifacts"], stage
        assert stages[stage]["proves"] and stages[stage]["does_not_prove"], stage
    assert report(completed_run)["status"] == "pass"
    live = stages["verify_ranks"]["figures"]["live"]
    assert live["ranks_seen"] == 2 and live["dist_backend"] == "gloo"
    plan = stages["verify_ranks"]["figures"]["plan"]
    assert plan["total_params"] == 4_022_468_096 and plan["fits"]
    # Judged apart from measuring: every row of at least from_mib held to the cpu floor, none below it.
    assert {row["verdict"] for row in live["bandwidth"]} == {"at or above the floor"}
    assert stages["verify_ranks"]["figures"]["floor"]["from_mib"] == 1
    # The native recipe's random-init control, launched twice on cpu: the same losses to the last bit.
    repeat = stages["train_native"]["figures"]["repeat"]
    assert repeat["steps"] == 3 and repeat["bit_identical"] and repeat["tolerance"] == 0.0
    assert stages["train_hf"]["figures"]["repeat"] == "not repeated (training.repeat.recipes)"
    # Convergence: the held-out loss after step 1 and every 25 steps, on documents no training run read.
    convergence = stages["convergence"]["figures"]
    assert [point["step"] for point in convergence["heldout_loss"]] == [1, 25, 50]  # SMALL's 50 steps
    assert convergence["heldout_fall"]["fall"] >= convergence["heldout_fall"]["min_fall"] == 0.03
    corpus = stages["fetch_corpus"]["figures"]
    held = corpus["heldout"]["documents"]
    assert held > 0 and held == (corpus["documents"] + held) // 20  # every 20th document of the corpus held out
    weights = stages["fetch_weights"]["figures"]
    assert weights["fixture"] and not weights["revision_pinned"]
    assert any("FIXTURE" in note for note in stages["fetch_weights"]["notes"])
    fixture = stages["fixture_checkpoint"]["figures"]
    assert fixture["final_loss"] < fixture["init_loss"] - 1.0
    assert (completed_run / "results" / "report.html").stat().st_size > 1000
    # The first table: every built stage with a deciding figure, none falling back to "see details".
    html = (completed_run / "results" / "report.html").read_text()
    decision = html[html.index('<table class="decision">'):html.index("</table>", html.index('class="decision"'))]
    assert decision.count("<tr>") == 1 + len(stages) and "see details" not in decision
    assert "gap " in decision and "nats, needs &gt;= 1" in decision and "tokens/s per rank" in decision


@pytest.mark.parametrize("stage", ["train_native", "train_hf"])
def test_training_stages_train_10_steps_from_the_fetched_weights(completed_run, stage):
    figures = {s["stage"]: s for s in report(completed_run)["stages"]}[stage]["figures"]
    assert figures["steps_trained"] == 10 and figures["ranks"] == 2
    gate = figures["gate"]
    assert gate["gap"] > 1.0, gate
    low, high = gate["control_band"]
    assert low <= gate["step1_loss_random_init"] <= high
    steps = figures["steps"]
    assert [s["step"] for s in steps] == list(range(1, 11))
    for step in steps:
        assert all(step[key] is not None and step[key] >= 0 for key in step), step
    assert 0 < figures["mean_mfu_pct_after_step_1"] < 100
    assert "measured" in figures["peak_flops_source"] and figures["peak_flops_per_rank"] > 0
    parity = {row["field"]: row["verdict"] for row in figures["parity"]}
    assert set(parity) >= {"vocab_size", "head_dim", "rope_theta", "rms_norm_eps", "max_position_embeddings"}
    assert parity["rope_theta"] == "match" and parity["head_dim"] == "match"
    export = completed_run / figures["export_dir"]
    assert any(p.suffix == ".safetensors" for p in export.iterdir())
    metrics = (completed_run / "results" / stage / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(metrics) == 10


def stage_figures(ws, stage):
    return {s["stage"]: s for s in report(ws)["stages"]}[stage]["figures"]


def test_both_exports_reload_with_transformers_and_match_torchtitan(completed_run):
    figures = stage_figures(completed_run, "export_reload")
    for recipe in ("hf", "native"):
        export = figures[recipe]
        assert export["tie_word_embeddings"] and export["lm_head_shares_embedding_storage"]
        assert export["max_change_from_fetched"] > 0
        assert export["generation"]["new_tokens"] > 0
        folder = completed_run / "results" / "export_reload" / recipe
        assert (folder / "config.json").exists() and (folder / "tokenizer.json").exists()
        assert not (folder / "sharded").exists()
    assert figures["recipes_agree"]["same_keys_and_dtypes"]


def test_kernel_numerics_table_counts_and_training(completed_run):
    figures = stage_figures(completed_run, "kernel_numerics")
    rows = figures["numerics"]
    assert {row["dtype"] for row in rows} == {"float32", "bfloat16"}
    assert {row["section"] for row in rows} == {"rope", "moe"}
    for row in rows:
        assert {"op", "dtype", "shape", "max_abs_diff", "tolerance"} <= set(row)
    assert figures["replacement_counts"]["dense"]["rope_hf"] > 0
    assert figures["seq_len_rule"] == {"applies": False, "verdict": "pass"}  # the cpu kernels take every length
    assert figures["replaced_model_trains"]
    compiled = figures["compile"]
    assert compiled["backend"] == "aot_eager" and compiled["models"]["dense"]["verdict"] == "pass"  # conftest.SMALL


def test_moe_reduced_counts_parameters_and_router_load(completed_run):
    stage = {s["stage"]: s for s in report(completed_run)["stages"]}["moe_reduced"]
    figures = stage["figures"]
    assert figures["full_width_parameters"] == 1_906_330_624
    assert figures["model"]["layers"] == 4 and figures["model"]["experts"] == 64 and figures["model"]["top_k"] == 4
    assert figures["steps_trained"] == 10
    load = figures["router_load"]
    assert load["steps_recorded"] == 10 and len(load["per_layer"]) == 4
    for layer in load["per_layer"]:
        assert len(layer["tokens_per_expert"]) == 64 and layer["max_over_mean"] >= 1.0
    assert "not a Qwen3-30B-A3B training result" in stage["notes"][0]


def test_moe_reduced_trains_with_both_kernels_one_per_layer_and_matches_the_plain_run(completed_run):
    figures = stage_figures(completed_run, "moe_reduced")
    replacements = figures["kernel_replacements"]
    for kernel, module in (("rope_hf", "attention.rope"), ("moe_grouped_experts", "moe.routed_experts.inner_experts")):
        entry = replacements["per_kernel"][kernel]
        assert entry["modules"] == [f"layers.{i}.{module}" for i in range(4)], kernel
        assert entry["implementation"], kernel
    assert len(replacements["log_lines"]) == 8
    agreement = replacements["against_plain"]
    assert [row["step"] for row in agreement["steps"]] == list(range(1, 11))
    # The plain run is a separate launch without replacements: its log has no replacement lines of its own.
    plain_recipe = json.loads((completed_run / "results" / "moe_reduced" / "recipe.plain.json").read_text())
    assert plain_recipe["replacements"] == []
    assert (completed_run / "results" / "moe_reduced" / "plain" / "metrics.jsonl").exists()
    assert stage_figures(completed_run, "train_native")["kernel_replacements"].startswith("none configured")


def test_the_benchmark_measures_warmup_and_steady_state_eager_and_compiled_apart(completed_run):
    stage = {s["stage"]: s for s in report(completed_run)["stages"]}["benchmark"]
    figures = stage["figures"]
    rows = {(row["recipe"], row["run"]): row for row in figures["table"]}
    # conftest.SMALL benchmarks the native recipe only (tests/test_benchmark.py: moe_reduced's replaced and plain runs).
    assert set(rows) == {("train_native", run) for run in ("eager", "compiled_cold", "compiled_warm")}
    for row in rows.values():
        assert row["time_to_step1_s"] > 0 and 0 < row["p10_s"] <= row["median_step_s"] <= row["p90_s"]
        assert row["tokens_per_s_per_instance"] == pytest.approx(2 * row["tokens_per_s_per_rank"])
        assert row["mfu_pct"] > 0 and row["peak_memory_gib_per_rank"] > 0 and row["data_wait_pct"] is not None
    for (recipe, run), row in rows.items():
        assert len(row["warmup_steps_s"]) == 2 and row["steady_steps"] == 5
        phases = [s["phase"] for s in figures["step_times"] if (s["recipe"], s["run"]) == (recipe, run)]
        assert phases == ["warm-up"] * 2 + ["steady"] * 5
    [compiled] = figures["compile"]
    assert figures["compile_backend"] == "aot_eager"  # conftest.SMALL
    # Measured, not asserted: when the warm cache did not reach step 1 first, the report says so.
    assert compiled["recipe"] == "train_native"
    assert compiled["warm_below_cold"] == (not any(n.startswith("COMPILE CACHE") for n in stage["notes"]))
    assert compiled["compile_cost_at_step1_s"] == pytest.approx(
        rows[("train_native", "compiled_cold")]["time_to_step1_s"] - rows[("train_native", "eager")]["time_to_step1_s"])
    assert figures["kernels"] == "no recipe with kernel replacements"
    # No price and no budget in the default config: each says what to set.
    assert figures["cost"].startswith("not priced: set benchmark.price.per_hour")
    assert figures["projection"].startswith("not projected: set benchmark.budget.tokens")
    assert "step time per step of each benchmarked recipe" in (completed_run / "results" / "report.html").read_text()


def test_each_stage_records_when_its_work_started_and_ended(completed_run):
    """Start and end bracket the work: within 5 % (or 2 s) of Snakemake's own benchmark of the job."""
    import csv
    from datetime import datetime

    benchmarks = sorted((completed_run / "benchmarks").glob("*.tsv"))
    assert {b.stem for b in benchmarks} == set(UPSTREAM)  # every stage, so no stage escapes the check
    for benchmark in benchmarks:
        stage = benchmark.stem
        with open(benchmark) as handle:
            job_s = float(next(csv.DictReader(handle, delimiter="\t"))["s"])
        summary = json.loads((completed_run / "results" / stage / "summary.json").read_text())
        recorded_s = (datetime.fromisoformat(summary["ended"])
                      - datetime.fromisoformat(summary["started"])).total_seconds()
        assert 0 < recorded_s <= job_s + 0.5, (stage, recorded_s, job_s)
        assert job_s - recorded_s <= max(2.0, 0.05 * job_s), (stage, recorded_s, job_s)


def test_snakemake_report_works_without_cores(completed_run):
    result = run_snakemake(completed_run, "--report", "report.zip")
    assert result.returncode == 0, output(result)[-3000:]
    assert (completed_run / "report.zip").stat().st_size > 1000


def test_one_log_per_job(completed_run):
    logs = {p.relative_to(completed_run / "logs").as_posix() for p in (completed_run / "logs").rglob("*.log")}
    expected = {f"{stage}/{stage}.log" for stage in UPSTREAM if stage != "pin_env"}
    expected |= {"pin_env/torch.log", "pin_env/summary.log", "report/report.log"}
    assert expected <= logs, expected - logs


def test_a_complete_run_is_not_redone(completed_run):
    with SHARED_RUN_EDIT:  # Snakemake locks the folder while it runs: no copy of the run takes its lock
        result = run_snakemake(completed_run, "--cores", "2", "results/report.html")
    assert result.returncode == 0
    assert "Nothing to be done" in output(result), output(result)


def test_parsing_the_workflow_imports_no_torch(completed_run):
    """What keeps the parse fast (measured by `python -m qwen3_pilot.tools.overhead --parse`, not here): no torch."""
    result = run_snakemake(completed_run, "-n")
    assert result.returncode == 0 and planned_jobs(result) == {}
    traced = subprocess.run(
        [sys.executable, "-X", "importtime", SNAKEMAKE, "-n", "--configfile", "config/test.yaml"],
        cwd=completed_run, capture_output=True, text=True,
    )
    imported = {line.split("|")[-1].strip() for line in traced.stderr.splitlines() if "|" in line}
    assert "snakemake" in imported
    assert not {m for m in imported if m == "torch" or m.startswith("torch.")}


def dry_run_with_bump(ws, old, new):
    """`snakemake -n` in the shared run with one pin of workflow/envs/cpu.txt respelled."""

    def bump(text):
        assert old in text
        return text.replace(old, new)

    with edited_in_place((ws / "workflow" / "envs" / "cpu.txt", bump)):
        return run_snakemake(ws, "-n")


def test_a_transformers_bump_reruns_only_what_uses_transformers(completed_run):
    """The plan: fail_fast launches every recipe, the Transformers-backend one too, and while it is due (a
    checkpoint) the dry run lists every device stage that reads its verdict; what reads none (verify_ranks, the
    data, the weights) stays. What then runs: test_training_e2e's transformers pin change (train_native stays)."""
    result = dry_run_with_bump(completed_run, "transformers==5.16.0", "transformers==5.17.0")
    assert planned_jobs(result).get("pin_package") == 1
    stages = planned_stages(result)
    assert {"pin_env", "fail_fast", "train_hf", "compare_recipes", "export_reload", "report"} <= stages
    assert not {"verify_ranks", "fetch_corpus", "fixture_checkpoint", "fetch_weights"} & stages


def test_a_torch_bump_reruns_verify_ranks_but_not_the_fixture(completed_run):
    result = dry_run_with_bump(completed_run, "torch==2.14.1", "torch==2.14.2")
    assert planned_jobs(result).get("pin_package") == 1
    stages = planned_stages(result)
    assert {"verify_ranks", "train_hf", "train_native", "kernel_numerics", "moe_reduced"} <= stages
    assert "fixture_checkpoint" not in stages and "fetch_weights" not in stages
