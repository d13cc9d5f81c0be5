"""The report's plots: which curves are drawn (controls included), which pairs must coincide, and that each
plot draws the figures it names: the data of every line, image and marker read back from the matplotlib
Figure (the `*_figure` functions), every series distinct so that one drawn from the wrong place shows."""

from __future__ import annotations

import base64

import pytest

from qwen3_pilot.plots import (
    DRAWN_IN_FULL,
    bandwidth_figure,
    bandwidth_png,
    benchmark_figure,
    benchmark_png,
    loss_curves_figure,
    loss_series,
    numerics_figure,
    numerics_png,
    report_plots,
    router_load_figure,
    router_load_png,
)


@pytest.fixture(autouse=True)
def close_figures():
    """The `*_figure` functions leave their figure open for the test to read; pyplot keeps it until closed."""
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


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


def drawn(line):
    """A line's points as plain numbers, x and y."""
    return [float(x) for x in line.get_xdata()], [float(y) for y in line.get_ydata()]


# Every loss distinct: a curve drawn from another series has other values.
TRAINING = [training("train_hf", [5.0, 4.9], control=11.6), training("train_native", [5.1, 4.7], control=7.6),
            training("moe_reduced", [7.6, 7.5], plain=[7.8, 7.2]),
            {"stage": "benchmark", "status": "not_run", "figures": {}}]


def test_the_loss_plot_has_each_recipe_its_controls_and_the_pairs_that_must_coincide():
    curves, pairs = loss_series(TRAINING)
    assert list(curves) == ["train_hf", "train_hf: random-init control", "train_native",
                            "train_native: random-init control", "moe_reduced", "moe_reduced: plain kernels (control)"]
    assert curves["train_hf: random-init control"] == [(1, 11.6)]
    assert pairs == [("train_hf", "train_native"), ("moe_reduced", "moe_reduced: plain kernels (control)")]
    assert is_png(report_plots(TRAINING)["overview"]["png"])


def test_the_loss_plot_draws_each_curve_from_its_own_losses_and_each_pair_difference():
    top, bottom = loss_curves_figure(TRAINING).axes
    lines = {line.get_label(): drawn(line) for line in top.lines}
    assert lines == {
        "train_hf": ([1, 2], pytest.approx([5.0, 4.9])),
        "train_hf: random-init control": ([1], pytest.approx([11.6])),
        "train_native": ([1, 2], pytest.approx([5.1, 4.7])),
        "train_native: random-init control": ([1], pytest.approx([7.6])),
        "moe_reduced": ([1, 2], pytest.approx([7.6, 7.5])),
        "moe_reduced: plain kernels (control)": ([1, 2], pytest.approx([7.8, 7.2])),
    }
    differences = {line.get_label(): drawn(line) for line in bottom.lines if not line.get_label().startswith("_")}
    assert differences == {
        "train_hf minus train_native": ([1, 2], pytest.approx([-0.1, 0.2])),
        "moe_reduced minus moe_reduced: plain kernels (control)": ([1, 2], pytest.approx([-0.2, 0.3])),
    }


def test_a_failed_stage_is_not_plotted():
    failed = training("train_native", [5.0])
    failed["status"] = "fail"
    assert loss_series([failed]) == ({}, [])
    assert loss_curves_figure([failed]) is None
    assert report_plots([failed]) == {}


MOE = {"stage": "moe_reduced", "status": "pass", "figures": {"router_load": {"per_layer": [
    {"layer": 0, "tokens_per_expert": [10, 30, 0, 40]},
    {"layer": 2, "tokens_per_expert": [20, 20, 20, 20]},
    {"layer": 5, "tokens_per_expert": [5, 5, 10, 20]}]}}}
NUMERICS = {"stage": "kernel_numerics", "status": "pass", "figures": {"numerics": [
    {"section": "rope", "op": "fwd", "dtype": "float32", "shape": [2], "max_abs_diff": 0.0, "tolerance": 1e-6},
    {"section": "rope", "op": "fwd", "dtype": "float32", "shape": [4], "max_abs_diff": 2e-7, "tolerance": 1e-6},
    {"section": "rope", "op": "fwd", "dtype": "bfloat16", "shape": [2], "max_abs_diff": 0.01, "tolerance": 0.03},
    {"section": "moe", "op": "grouped", "dtype": "float32", "shape": [2], "max_abs_diff": 3e-6, "tolerance": 1e-5}]}}


def test_router_load_draws_each_layers_counts_over_an_even_share_one_row_per_layer():
    axes = router_load_figure([MOE]).axes[0]  # axes[1]: the colorbar
    (image,) = axes.images
    # Row = layer (in the stage's order), column = expert; each count over its layer's mean count.
    assert image.get_array().tolist() == [[0.5, 1.5, 0.0, 2.0], [1.0, 1.0, 1.0, 1.0], [0.5, 0.5, 1.0, 2.0]]
    assert [label.get_text() for label in axes.get_yticklabels()] == ["layer 0", "layer 2", "layer 5"]
    assert axes.get_title().startswith("moe_reduced: ")


def test_numerics_draws_the_largest_difference_over_the_shapes_and_the_tolerance_on_each_ops_row():
    axes = numerics_figure([NUMERICS]).axes[0]
    # Rows: op by op (sorted), dtype by dtype (sorted) within each; a marker where that pair was checked.
    assert [label.get_text() for label in axes.get_yticklabels()] == [
        "moe: grouped (bfloat16)", "moe: grouped (float32)", "rope: fwd (bfloat16)", "rope: fwd (float32)"]
    markers = {points.get_label(): points.get_offsets().tolist() for points in axes.collections}
    assert markers == {
        "bfloat16: largest |diff|": [[0.01, 2]],
        "bfloat16: tolerance": [[0.03, 2]],
        "float32: largest |diff|": [[3e-6, 1], [2e-7, 3]],
        "float32: tolerance": [[1e-5, 1], [1e-6, 3]],
    }


def test_a_tolerance_in_ulps_is_not_drawn_on_the_absolute_axis():
    held = [{**row, "held_to": "max_ulp_diff", "tolerance": 2} if row["dtype"] == "float32" and row["section"] == "rope"
            else row for row in NUMERICS["figures"]["numerics"]]
    axes = numerics_figure([{**NUMERICS, "figures": {"numerics": held}}]).axes[0]
    markers = {points.get_label(): points.get_offsets().tolist() for points in axes.collections}
    assert markers["float32: tolerance"] == [[1e-5, 1]]  # moe's absolute one only; rope's 2 ulps is no point here


# Bus bandwidth distinct per collective and size: a line drawn from the wrong rows has other values.
RANKS = {"stage": "verify_ranks", "status": "pass", "figures": {"live": {"ranks_seen": 2, "dist_backend": "gloo",
         "bandwidth": [{"collective": name, "size_mib": size, "busbw_gbps": base * size}
                       for size in (1.0, 2.0, 4.0) for name, base in (("all_reduce", 1.0), ("all_gather", 3.0))]}}}


def test_the_bandwidth_plot_draws_each_collectives_bus_bandwidth_against_size():
    axes = bandwidth_figure([RANKS]).axes[0]
    assert {line.get_label(): drawn(line) for line in axes.lines} == {
        "all_reduce": ([1.0, 2.0, 4.0], [1.0, 2.0, 4.0]), "all_gather": ([1.0, 2.0, 4.0], [3.0, 6.0, 12.0])}
    assert is_png(bandwidth_png([RANKS])) and set(report_plots([RANKS])) == {"verify_ranks"}
    assert bandwidth_png([{**RANKS, "status": "fail"}]) is None


def test_router_load_and_numerics_are_drawn_from_their_own_stages_only():
    assert is_png(router_load_png([MOE])) and is_png(numerics_png([NUMERICS]))
    assert set(report_plots([MOE, NUMERICS])) == {"moe_reduced", "kernel_numerics"}
    assert router_load_png([NUMERICS]) is None and numerics_png([MOE]) is None


def step_time(recipe, run, step):
    """A value of its own for every recipe, run and step."""
    return {"train_native": 1.0, "moe_reduced": 2.0}[recipe] + {"eager": 0.1, "compiled_cold": 0.2}[run] + step / 100


RUNS = (("train_native", ("eager", "compiled_cold")), ("moe_reduced", ("eager",)))  # by recipe
BENCH = {"stage": "benchmark", "status": "pass", "figures": {"warmup_steps": 2, "step_times": [
    {"recipe": recipe, "run": run, "step": step, "phase": "warm-up" if step <= 2 else "steady",
     "step_time_s": step_time(recipe, run, step)}
    for recipe, runs in RUNS for run in runs for step in range(1, 6)]}}


def test_the_benchmark_plot_draws_each_recipes_runs_from_their_own_step_times():
    panels = benchmark_figure([BENCH]).axes
    assert [axes.get_title() for axes in panels] == [f"{recipe}: step time per step" for recipe, _ in RUNS]
    for axes, (recipe, runs) in zip(panels, RUNS, strict=True):
        steps = [1, 2, 3, 4, 5]
        assert {line.get_label(): drawn(line) for line in axes.lines} == {
            run: (steps, pytest.approx([step_time(recipe, run, step) for step in steps])) for run in runs}
        (warmup,) = axes.patches  # the shaded warm-up: steps 1 and 2
        assert (warmup.get_x(), warmup.get_x() + warmup.get_width()) == (0.5, 2.5)


def test_the_benchmark_plot_is_encoded_and_needs_its_stage_and_step_times():
    assert is_png(benchmark_png([BENCH]))
    assert set(report_plots([BENCH])) == {"benchmark"}
    assert benchmark_png([{**BENCH, "status": "fail"}]) is None
    # The page leaves DRAWN_IN_FULL's figures to this plot: without them it has nothing to draw.
    without = {key: value for key, value in BENCH["figures"].items() if key not in DRAWN_IN_FULL["benchmark"]}
    assert benchmark_png([{**BENCH, "figures": without}]) is None
