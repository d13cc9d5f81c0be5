"""The benchmark's arithmetic on recorded metric lines: warm-up excluded, percentiles, the spread, MFU, cost;
the stage on recorded runs and its judge (the notes, the noisy flag, cost and peak); and how its figures
compare with a baseline's (timings apart from settings and runs)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from conftest import backend_config

from qwen3_pilot.benchmark_runs import (
    BenchmarkError,
    mfu_pct,
    percentile,
    split_phases,
    steady_state,
)
from qwen3_pilot.stages.benchmark_judging import cost, projection
from qwen3_pilot.training import read_steps

# torchtitan's metric lines as titan_metrics writes them (a slow first step: startup and compilation).
TIMES = [9.0, 0.5, 0.4, 0.20, 0.21, 0.19, 0.20, 0.22, 0.18, 0.20]


def record(step, seconds, memory_gib=0.5):
    return {
        "step": step, "loss_metrics/global_avg_loss": 5.0, "grad_norm": 1.0, "throughput(tps)": 512 / seconds,
        "tflops": 0.01 * 0.2 / seconds, "mfu(%)": 1.0, "memory/max_active(GiB)": memory_gib,
        "time_metrics/end_to_end(s)": seconds, "time_metrics/data_loading(%)": 2.0,
    }


def metrics_file(tmp_path, times=TIMES):
    lines = [json.dumps(record(i + 1, t, 0.5 + 0.01 * i)) for i, t in enumerate(times)]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(reversed(lines)) + "\n")  # out of order on purpose
    return path


def test_steady_state_never_includes_a_warmup_step(tmp_path):
    steps = read_steps(metrics_file(tmp_path))
    warm, steady = split_phases(steps, 3)
    assert [s["step"] for s in warm] == [1, 2, 3] and [s["step"] for s in steady] == list(range(4, 11))
    figures = steady_state(steps, warmup=3, ranks=2, peak_flops_per_rank=1e10)
    assert figures["step_time_s"]["median"] == pytest.approx(0.20)
    assert figures["warmup_step_time_s"] == [9.0, 0.5, 0.4]
    assert figures["steady_steps"] == 7
    assert (figures["tokens_per_s_per_rank"] == pytest.approx(2560)
            and figures["tokens_per_s_per_instance"] == pytest.approx(5120))
    assert figures["mfu_pct"] == pytest.approx(100 * 0.01e12 / 1e10)
    assert figures["peak_memory_gib_per_rank"] == pytest.approx(0.59)  # over the whole run
    assert figures["data_wait_pct"] == pytest.approx(2.0)


def test_percentiles_interpolate_between_ranks():
    values = [0.18, 0.19, 0.20, 0.20, 0.21, 0.22, 0.20]
    assert percentile(values, 50) == pytest.approx(0.20)
    assert percentile(values, 10) == pytest.approx(0.186)
    assert percentile(values, 90) == pytest.approx(0.214)
    assert percentile([1.0], 90) == 1.0


def test_the_steady_phases_spread_is_its_coefficient_of_variation(tmp_path):
    steps = read_steps(metrics_file(tmp_path, [9.0, 0.2, 0.2, 0.4, 0.2, 0.4, 0.2]))
    figures = steady_state(steps, warmup=1, ranks=1, peak_flops_per_rank=1e10)
    assert figures["step_time_s"]["cv"] == pytest.approx(0.3536, abs=1e-4)
    with pytest.raises(BenchmarkError, match="7 steps logged, 7 of them warm-up"):
        steady_state(steps, warmup=7, ranks=1, peak_flops_per_rank=1e10)


def test_cost_per_million_tokens_and_of_the_warmup():
    figures = cost(price_per_hour=36.0, tokens_per_s_per_instance=10_000, warmup_s=600)
    assert figures["per_million_tokens"] == pytest.approx(1.0)  # 36 $/h = 0.01 $/s; 1e6 tokens = 100 s
    assert figures["tokens_per_unit_price"] == pytest.approx(1e6)
    assert figures["warmup"] == pytest.approx(6.0)


def test_the_full_run_is_projected_linearly_with_the_warmup_paid_once_per_instance():
    # 3.6e9 tokens at 10,000 tokens/s on 2 instances at 90 %: 200,000 s, after a 600 s warm-up.
    row = projection(3.6e9, 2, 0.9, 10_000, 600, price_per_hour=36.0)
    assert row["wall_time_h"] == pytest.approx((600 + 200_000) / 3600)
    assert row["instance_hours"] == pytest.approx(2 * (600 + 200_000) / 3600)
    assert row["cost"] == pytest.approx(36.0 * 2 * (600 + 200_000) / 3600)
    assert projection(3.6e9, 2, 0.9, 10_000, 600, price_per_hour=None)["cost"] is None
    with pytest.raises(BenchmarkError, match="nothing to project from"):
        projection(1e9, 1, 1.0, 0.0, 0, None)


def test_mfu_against_the_backends_peak():
    assert mfu_pct(79.0, 158e12) == pytest.approx(50.0)
    with pytest.raises(BenchmarkError, match="MFU needs a positive peak"):
        mfu_pct(1.0, 0.0)


# Time to the end of step 1 of each run of the recorded stage: the warm-cache compiled run not faster.
STEP1 = {"eager": 9.0, "plain": 8.0, "compiled_cold": 30.0, "compiled_warm": 31.0}
SETTINGS = {"recipes": ["train_native", "moe_reduced"], "compile_recipes": ["train_native"],
            "compile_backend": "default", "warmup_steps": 2, "measured_steps": 3, "noisy_cv": 0.1,
            "price": {"per_hour": 36.0, "currency": "USD", "kind": "capacity-block", "region": "us-east-2",
                      "as_of": "2026-12-01", "source": "a test's quote"},
            "budget": {"tokens": None, "instances": 1, "scaling_efficiencies": [1.0, 0.9, 0.75]}}
ROPE = {"kernel": "rope_hf", "layers": "*", "module": "attention.rope"}


def recorded_times(recipe, variant, settings):
    """Each step's time of one run: step 1 (logged STEP1 s after the launch: 1 s of startup before it),
    0.5 s, then 0.2 s steps."""
    steps = settings["warmup_steps"] + settings["measured_steps"]
    return [STEP1[variant] - 1.0, 0.5] + [0.2] * (steps - 2)


def run_stage(folder, monkeypatch, *, times=recorded_times, memory_gib=0.5, settings=SETTINGS, eager_compiles=False):
    """The stage with its trainer launches replaced by recorded metric lines, each run's step times from
    `times(recipe, variant, settings)`, then its judge, each given its part of `settings` (the rules' params):
    (the judged summary, what each launch was given, with the files in its compile cache folder at launch).
    `eager_compiles`: a cpu backend whose eager runs compile, as neuron's do."""
    from qwen3_pilot.backends import make_backend
    from qwen3_pilot.launch import Launch
    from qwen3_pilot.parse_time.config import stage_judging, stage_measuring
    from qwen3_pilot.stages import benchmark as stage
    from qwen3_pilot.stages import judge

    folder.mkdir(parents=True, exist_ok=True)
    backend = dataclasses.replace(make_backend(backend_config("cpu", 2), str(folder / "cache")),
                                  eager_compiles=eager_compiles)
    monkeypatch.setattr(stage, "usable_backend", lambda *args: backend)
    monkeypatch.setattr(stage, "ranks_peak_flops", lambda path: 1e10)
    monkeypatch.setattr(stage, "read_checkpoint_values", lambda path: {"vocab_size": 256})
    launched = {}

    def fake_launch(what, backend, trainer, *, run_dir, extra_env, launch_name, recipe_path, **kwargs):
        variant = run_dir.name
        trainer.write(recipe_path)  # as training.launch_and_read does
        cache = Path(extra_env["TORCHINDUCTOR_CACHE_DIR"]).parent if extra_env else None
        launched[launch_name] = {"env": extra_env, "recipe": dataclasses.asdict(trainer),
                                 "cache_files": sorted(p.name for p in cache.rglob("*")) if cache else None}
        if variant == "compiled_cold":
            (Path(extra_env["TORCHINDUCTOR_CACHE_DIR"]) / "graph").parent.mkdir(parents=True, exist_ok=True)
            (Path(extra_env["TORCHINDUCTOR_CACHE_DIR"]) / "graph").write_text("compiled")
        if variant == "compiled_warm":  # the cold run's cache, copied
            assert (Path(extra_env["TORCHINDUCTOR_CACHE_DIR"]) / "graph").read_text() == "compiled"
        run_dir.mkdir(parents=True)
        clock, lines = 1000.0, []
        for step, seconds in enumerate(times(run_dir.parent.name, variant, settings), start=1):
            clock += seconds + (1.0 if step == 1 else 0.0)
            lines.append(record(step, seconds, memory_gib) | {"logged_at": clock})
        (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
        return Launch([], {}, 0, clock - 1000.0, started_at=1000.0), read_steps(run_dir / "metrics.jsonl")

    monkeypatch.setattr(stage, "launch_and_read", fake_launch)
    moe = {"layers": 1, "experts": 2, "top_k": 1, "rope_theta": 1e6,
           "width": {"dim": 8, "n_heads": 2, "n_kv_heads": 1, "head_dim": 4, "moe_hidden_dim": 8}}
    training = {"steps": 10, "seq_len": 256, "local_batch_size": 1, "global_batch_size": 2, "seed": 0, "lr": 1e-3,
                "warmup_steps": 1, "mixed_precision_param": "float32", "export_dtype": "float32", "native_flavor": None,
                "attention": "sdpa", "comm_init_timeout_s": 300, "comm_train_timeout_s": 100,
                "accepted_differences": {}}
    config = {"benchmark": settings}
    stage.run(
        backend_config={"backend": "cpu", "ranks": 2, "neuron": {"lnc": 2}}, dataset="c4_test", training=training,
        moe=moe, kernels={"train_native": [], "moe_reduced": [ROPE]}, settings=stage_measuring(config, "benchmark"),
        cache_root=str(folder), checkpoint_dir=folder, corpus_dir=folder, ranks_record=folder,
        out_dir=folder / "runs", measured_path=folder / "measured.json", log_path=folder / "log",
    )
    summary = judge.run(stage="benchmark", judging=stage_judging(config, "benchmark"),
                        measured_path=folder / "measured.json", summary_path=folder / "summary.json")
    return summary, launched


def test_the_stage_measures_each_run_and_says_when_the_warm_cache_was_not_faster(tmp_path, monkeypatch):
    """Which runs each recipe gets, a compile cache per measurement (the warm one a copy of what the cold run
    left), the comparisons, the peak MFU is measured against, cost at a given price (a million tokens, and
    the warm-up at its measured length), and a note when the warm cache did not reach step 1 first."""
    summary, launched = run_stage(tmp_path, monkeypatch)
    assert set(launched) == {"train_native-eager", "train_native-compiled_cold", "train_native-compiled_warm",
                             "moe_reduced-eager", "moe_reduced-plain"}
    assert launched["train_native-compiled_cold"]["recipe"]["compile_backend"] == "inductor"
    assert all(not run["recipe"]["use_checkpoint"] for run in launched.values())  # random init, nothing saved
    assert launched["train_native-eager"]["env"] == {} and launched["train_native-eager"]["recipe"]["steps"] == 5
    assert launched["moe_reduced-plain"]["recipe"]["replacements"] == ()
    assert launched["moe_reduced-eager"]["recipe"]["replacements"] == (ROPE,)
    assert launched["train_native-eager"]["recipe"]["compile_backend"] is None
    figures = summary["figures"]
    [compiled] = figures["compile"]
    assert compiled["time_to_step1_s_cold"] == pytest.approx(30.0) and not compiled["warm_below_cold"]
    assert any(note.startswith("COMPILE CACHE: train_native: the warm-cache compiled run reached step 1 in 31.0 s, "
                               "not below the cold one's 30.0 s") for note in summary["notes"])
    assert not any(note.startswith("NOISY") for note in summary["notes"])  # steady steps of 0.2 s each
    assert [row["recipe"] for row in figures["kernels"]] == ["moe_reduced"]
    # cpu: MFU is against verify_ranks' measured matmul peak, and the summary says so.
    assert figures["peak_flops_per_rank"] == 1e10 and figures["peak_flops_source"].startswith("measured: ")
    eager = next(r for r in figures["table"] if (r["recipe"], r["run"]) == ("train_native", "eager"))
    assert eager["mfu_pct"] == pytest.approx(100 * 0.01e12 / 1e10)  # 0.01 TFLOPS per steady step against 1e10
    cost_rows = {row["recipe"]: row for row in figures["cost"]}
    assert cost_rows["train_native"]["per_million_tokens"] == pytest.approx(
        0.01 / eager["tokens_per_s_per_instance"] * 1e6)
    # The warm-up ends when step 2 is logged: 8 s step 1 + 1 s before it + 0.5 s step 2 = 9.5 s after the
    # launch, at 36 $/h (0.01 $/s) 0.095 $.
    assert eager["warmup_phase_s"] == pytest.approx(9.5)
    assert cost_rows["train_native"]["warmup"] == pytest.approx(36.0 / 3600 * 9.5)
    assert len(figures["step_times"]) == 5 * 5


def test_a_named_compile_backend_compiles_the_compiled_runs_and_the_summary_names_it(tmp_path, monkeypatch):
    """benchmark.compile_backend: aot_eager (the test config's) instead of the cpu backend's inductor."""
    summary, launched = run_stage(tmp_path, monkeypatch, settings={**SETTINGS, "compile_backend": "aot_eager"})
    assert {name: run["recipe"]["compile_backend"] for name, run in launched.items()} == {
        "train_native-eager": None, "train_native-compiled_cold": "aot_eager",
        "train_native-compiled_warm": "aot_eager", "moe_reduced-eager": None, "moe_reduced-plain": None}
    assert summary["figures"]["compile_backend"] == "aot_eager"
    assert "compiled (aot_eager) against eager" in summary["proves"]


def test_where_eager_compiles_eager_and_plain_start_from_empty_caches_of_their_own(tmp_path, monkeypatch):
    """neuron (TorchNeuron compiles in eager mode too): compile cost = cold - eager compares two cold runs, so
    the eager run gets an emptied cache folder of its own, apart from the cold and warm ones, and so does the
    plain run its step 1 is compared with; elsewhere both keep the project's caches (no cache of their own)."""
    runs = tmp_path / "runs" / "train_native" / "compile_cache"
    (runs / "eager" / "torchinductor_cache_dir").mkdir(parents=True)
    (runs / "eager" / "torchinductor_cache_dir" / "left-by-an-earlier-run").write_text("graph")
    summary, launched = run_stage(tmp_path, monkeypatch, eager_compiles=True)
    caches = {name: launch["env"].get("TORCHINDUCTOR_CACHE_DIR") for name, launch in launched.items()}
    assert caches == {"train_native-eager": str(runs / "eager" / "torchinductor_cache_dir"),
                      "train_native-compiled_cold": str(runs / "cold" / "torchinductor_cache_dir"),
                      "train_native-compiled_warm": str(runs / "warm" / "torchinductor_cache_dir"),
                      "moe_reduced-eager": str(tmp_path / "runs" / "moe_reduced" / "compile_cache" / "eager" /
                                               "torchinductor_cache_dir"),
                      "moe_reduced-plain": str(tmp_path / "runs" / "moe_reduced" / "compile_cache" / "plain" /
                                               "torchinductor_cache_dir")}
    assert launched["train_native-eager"]["cache_files"] == launched["train_native-compiled_cold"]["cache_files"] == []
    assert "compares two cold runs: the eager run compiles too and starts from an empty compile cache" in (
        summary["proves"])
    _, launched = run_stage(tmp_path / "cpu", monkeypatch)
    assert launched["train_native-eager"]["env"] == {} == launched["moe_reduced-eager"]["env"]


def test_a_run_whose_steady_steps_vary_is_noted_noisy(tmp_path, monkeypatch):
    """Steady steps of 0.2, 0.4 and 0.2 s: a coefficient of variation of 0.354, above noisy_cv = 0.1."""
    def times(recipe, variant, settings):
        usual = recorded_times(recipe, variant, settings)
        return usual[:2] + [0.2, 0.4, 0.2] if (recipe, variant) == ("moe_reduced", "plain") else usual

    summary, _ = run_stage(tmp_path, monkeypatch, times=times)
    noisy = [note for note in summary["notes"] if note.startswith("NOISY")]
    assert noisy == ["NOISY: moe_reduced (plain): steady step time varies by 35% (coefficient of variation above "
                     "benchmark.noisy_cv = 0.1)"]
    plain = next(r for r in summary["figures"]["table"] if (r["recipe"], r["run"]) == ("moe_reduced", "plain"))
    assert plain["noisy"] and plain["cv"] == pytest.approx(0.3536, abs=1e-4)


def test_the_noisy_flag_and_the_cost_are_judged_from_the_recorded_runs(tmp_path, monkeypatch):
    """Rule judge on the measured.json of a run with a spread of 0.354: a noisy_cv of 0.5 flags nothing, a
    doubled price doubles both costs, and no price leaves a sentence naming what to set."""
    from qwen3_pilot.stages import judge

    def times(recipe, variant, settings):
        usual = recorded_times(recipe, variant, settings)
        return usual[:2] + [0.2, 0.4, 0.2] if (recipe, variant) == ("moe_reduced", "plain") else usual

    first, _ = run_stage(tmp_path, monkeypatch, times=times)

    def rejudged(**judging):
        return judge.run(stage="benchmark", judging={"noisy_cv": 0.1, "price": SETTINGS["price"],
                                                     "budget": SETTINGS["budget"], **judging},
                         measured_path=tmp_path / "measured.json", summary_path=tmp_path / "summary.json")

    calm = rejudged(noisy_cv=0.5)
    assert not any(row["noisy"] for row in calm["figures"]["table"]) and calm["figures"]["noisy_cv"] == 0.5
    assert not any(note.startswith("NOISY") for note in calm["notes"])
    dearer = rejudged(price={**SETTINGS["price"], "per_hour": 72.0})
    for before, after in zip(first["figures"]["cost"], dearer["figures"]["cost"], strict=True):
        assert after["per_million_tokens"] == pytest.approx(2 * before["per_million_tokens"])
        assert after["warmup"] == pytest.approx(2 * before["warmup"])
    unpriced = rejudged(price={**SETTINGS["price"], "per_hour": None})["figures"]
    assert unpriced["cost"] == unpriced["price"] == (
        "not priced: set benchmark.price.per_hour with its kind, region, as_of and source (no price is built in)")
    assert first["figures"]["projection"].startswith("not projected: set benchmark.budget.tokens")
    assert first["figures"]["table"] == rejudged()["figures"]["table"]


def test_a_budget_is_projected_per_recipe_and_efficiency_and_says_what_it_rests_on(tmp_path, monkeypatch):
    from qwen3_pilot.stages import judge

    run_stage(tmp_path, monkeypatch)
    budget = {"tokens": 1e9, "instances": 4, "scaling_efficiencies": [1.0, 0.75]}
    summary = judge.run(stage="benchmark", judging={"noisy_cv": 0.1, "price": SETTINGS["price"], "budget": budget},
                        measured_path=tmp_path / "measured.json", summary_path=tmp_path / "summary.json")
    figures = summary["figures"]
    projected = figures["projection"]
    assert projected["basis"].startswith("A linear projection from a pilot of 3 steady steps of each recipe on ")
    assert ("1,000,000,000 tokens on 4 instance(s)" in projected["basis"]
            and "cost at 36 USD per instance-hour (capacity-block, us-east-2, as of 2026-12-01; a test's quote)"
            in projected["basis"])
    eager = {row["recipe"]: row for row in figures["table"] if row["run"] == "eager"}
    assert [(row["recipe"], row["scaling_efficiency"]) for row in projected["rows"]] == [
        ("train_native", 1.0), ("train_native", 0.75), ("moe_reduced", 1.0), ("moe_reduced", 0.75)]
    for row in projected["rows"]:
        rate = eager[row["recipe"]]["tokens_per_s_per_instance"] * 4 * row["scaling_efficiency"]
        wall_s = eager[row["recipe"]]["warmup_phase_s"] + 1e9 / rate
        assert row["wall_time_h"] == pytest.approx(wall_s / 3600)
        assert row["cost"] == pytest.approx(36.0 * 4 * wall_s / 3600)
    assert unclassified(summary) == set()


# ---- the benchmark against a baseline (changes.py): timings apart, settings and runs compared ----


def as_report(summary):
    return {"stages": [summary], "environment": {}, "config": {}, "provenance": {}}


def benchmark_changes(baseline, now):
    from qwen3_pilot.changes import baseline_changes, headline

    changes = baseline_changes(as_report(now), as_report(baseline))
    return changes["stages"]["benchmark"], headline({"recorded": True, "ran": ["benchmark"], "reused": []}, changes)


def unclassified(summary):
    """The names of the compared figures of a benchmark summary that changes.FIGURE_KINDS does not name."""
    from qwen3_pilot.changes import FIGURE_KINDS, compared, figure_name, flatten

    names = {figure_name(path) for path in flatten(compared("benchmark", summary["figures"]))}
    return names - set(FIGURE_KINDS["benchmark"])


def test_every_figure_the_benchmark_records_is_classified_for_the_comparison(tmp_path, monkeypatch):
    """A figure the stage starts recording must be named timing or stable in changes.FIGURE_KINDS: its name
    alone (a `cv`, a cost `warmup`) need not say that it moves on every rerun. With and without the compile
    recipes and the cost, whose sentences stand in for their tables."""
    full, _ = run_stage(tmp_path / "full", monkeypatch)
    bare, _ = run_stage(tmp_path / "bare", monkeypatch, settings={
        **SETTINGS, "price": {**SETTINGS["price"], "per_hour": None}, "compile_recipes": []})
    assert isinstance(bare["figures"]["compile"], str) and isinstance(bare["figures"]["cost"], str)
    assert unclassified(full) == set() and unclassified(bare) == set()


def test_a_rerun_that_differs_only_in_timings_moves_no_figure(tmp_path, monkeypatch):
    """Every step slower (compiled ones 20%, the others 10%; a noisy steady phase in one run) and more
    memory: the timing figures move, the headline says no figure moved apart from timings, and the per-step
    times are not compared."""
    baseline, _ = run_stage(tmp_path / "before", monkeypatch)

    def slower(recipe, variant, settings):
        factor = 1.2 if variant.startswith("compiled") else 1.1
        usual = [factor * t for t in recorded_times(recipe, variant, settings)]
        return usual[:2] + [0.2, 0.4, 0.2] if (recipe, variant) == ("moe_reduced", "eager") else usual

    now, _ = run_stage(tmp_path / "now", monkeypatch, times=slower, memory_gib=0.7)
    moved, said = benchmark_changes(baseline, now)
    assert moved["figures_moved"] == []
    timing = {change["figure"] for change in moved["timing_figures_moved"]}
    assert {"table[recipe=moe_reduced,run=eager].cv", "table[recipe=moe_reduced,run=eager].noisy",
            "table[recipe=train_native,run=eager].tokens_per_s_per_rank",
            "table[recipe=moe_reduced,run=eager].peak_memory_gib_per_rank", "cost[recipe=moe_reduced].warmup",
            "cost[recipe=train_native].per_million_tokens", "compile[recipe=train_native].steady_gain_relative",
            "kernels[recipe=moe_reduced].step_time_relative",
            "kernels[recipe=moe_reduced].peak_memory_gib_plain"} <= timing
    assert not any(path.startswith("step_times") for path in timing)
    assert said == "benchmark reran; nothing reused; no figure moved apart from timings; timings moved in benchmark."


def test_a_changed_setting_or_list_of_runs_moves_figures(tmp_path, monkeypatch):
    """Three warm-up steps instead of two, and moe_reduced no longer benchmarked: the setting and every
    figure of the dropped runs move, not only as timings."""
    baseline, _ = run_stage(tmp_path / "before", monkeypatch)
    settings = {**SETTINGS, "warmup_steps": 3, "measured_steps": 2, "recipes": ["train_native"]}
    now, _ = run_stage(tmp_path / "now", monkeypatch, settings=settings)
    moved, said = benchmark_changes(baseline, now)
    figures = {change["figure"]: change for change in moved["figures_moved"]}
    assert figures["warmup_steps"]["before"] == 2 and figures["warmup_steps"]["now"] == 3
    assert figures["table[recipe=train_native,run=eager].steady_steps"]["now"] == 2
    assert figures["table[recipe=moe_reduced,run=plain].median_step_s"]["now"] == "(absent)"
    assert figures["kernels[recipe=moe_reduced].step_time_relative"]["now"] == "(absent)"
    assert said.startswith(f"benchmark reran; nothing reused; figures moved in benchmark ({len(figures)})")
