"""The report's plots: which curves are drawn (controls included), which pairs must coincide, and that each
plot is drawn from the figures it names."""

from __future__ import annotations

import base64

from qwen3_pilot.plots import loss_series, numerics_png, report_plots, router_load_png


def training(stage, losses, control=None, plain=None):
    figures = {"steps": [{"step": i + 1, "loss": loss} for i, loss in enumerate(losses)]}
    if control is not None:
        figures["control_steps"] = [{"step": 1, "loss": control}]
    if plain is not None:
        figures["kernel_replacements"] = {"against_plain": {"steps": [
            {"step": i + 1, "loss_plain": loss, "loss_replaced": losses[i]} for i, loss in enumerate(plain)]}}
    return {"stage": stage, "status": "pass", "figures": figures}


def is_png(data):
    return base64.b64decode(data).startswith(b"\x89PNG")


def test_the_loss_plot_has_each_recipe_its_controls_and_the_pairs_that_must_coincide():
    stages = [training("train_hf", [5.0, 4.9], control=11.6), training("train_native", [5.0, 4.9], control=7.6),
              training("moe_reduced", [7.6, 7.5], plain=[7.6, 7.5]),
              {"stage": "benchmark", "status": "not_run", "figures": {}}]
    curves, pairs = loss_series(stages)
    assert list(curves) == ["train_hf", "train_hf: random-init control", "train_native",
                            "train_native: random-init control", "moe_reduced", "moe_reduced: plain kernels (control)"]
    assert curves["train_hf: random-init control"] == [(1, 11.6)]
    assert pairs == [("train_hf", "train_native"), ("moe_reduced", "moe_reduced: plain kernels (control)")]
    assert is_png(report_plots(stages)["overview"]["png"])


def test_a_failed_stage_is_not_plotted():
    failed = training("train_native", [5.0])
    failed["status"] = "fail"
    assert loss_series([failed]) == ({}, [])
    assert report_plots([failed]) == {}


def test_router_load_and_numerics_are_drawn_from_their_stages():
    moe = {"stage": "moe_reduced", "status": "pass", "figures": {"router_load": {"per_layer": [
        {"layer": 0, "tokens_per_expert": [10, 30]}, {"layer": 1, "tokens_per_expert": [20, 20]}]}}}
    numerics = {"stage": "kernel_numerics", "status": "pass", "figures": {"numerics": [
        {"section": "rope", "op": "fwd", "dtype": "float32", "shape": [2], "max_abs_diff": 0.0, "tolerance": 1e-6},
        {"section": "rope", "op": "fwd", "dtype": "bfloat16", "shape": [2], "max_abs_diff": 0.01, "tolerance": 0.03}]}}
    assert is_png(router_load_png([moe])) and is_png(numerics_png([numerics]))
    assert set(report_plots([moe, numerics])) == {"moe_reduced", "kernel_numerics"}
    assert router_load_png([numerics]) is None and numerics_png([moe]) is None


def test_the_benchmark_plot_draws_each_recipes_runs_from_the_step_times():
    from qwen3_pilot.plots import benchmark_png

    step_times = [{"recipe": recipe, "run": run, "step": step, "phase": "warm-up" if step <= 2 else "steady",
                   "step_time_s": 30.0 if step == 1 else 0.2}
                  for recipe, runs in (("train_native", ("eager", "compiled_cold")), ("moe_reduced", ("eager",)))
                  for run in runs for step in range(1, 6)]
    bench = {"stage": "benchmark", "status": "pass", "figures": {"step_times": step_times, "warmup_steps": 2}}
    assert is_png(benchmark_png([bench]))
    assert set(report_plots([bench])) == {"benchmark"}
    assert benchmark_png([{**bench, "status": "fail"}]) is None
    # The page leaves DRAWN_IN_FULL's figures to this plot: without them it has nothing to draw.
    from qwen3_pilot.plots import DRAWN_IN_FULL

    without = {key: value for key, value in bench["figures"].items() if key not in DRAWN_IN_FULL["benchmark"]}
    assert benchmark_png([{**bench, "figures": without}]) is None
