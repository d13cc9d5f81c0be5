"""The report's plots, from the stage summaries' figures: loss per step with the controls, router load per
expert per layer, kernel numerics per op and dtype. Each is a PNG returned as base64 for an <img> data URI
(it carries no markup into the page, and the page stays one self-contained file), or None when the run has
nothing to plot. Each `*_png` encodes what its `*_figure` draws (a matplotlib Figure, or None), so the tests
read the drawn data from the figure. matplotlib with the Agg backend, imported when a plot is drawn."""

from __future__ import annotations

import base64
import io
from typing import Any

from .recipe_registry import FROM_FETCHED_WEIGHTS_STAGES


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(figure) -> str:
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="png")
    _pyplot().close(figure)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _encoded(figure) -> str | None:
    return None if figure is None else _png(figure)


def loss_series(stages: list[dict[str, Any]]) -> tuple[dict[str, list[tuple[int, float]]], list[tuple[str, str]]]:
    """Every loss curve the passed stages logged, by label: each recipe, its random-init control (step 1
    only) and the same run without kernel replacements; and the pairs expected to coincide (the two
    recipes on the same weights and batch; a run with replaced kernels and its plain twin)."""
    curves: dict[str, list[tuple[int, float]]] = {}
    pairs: list[tuple[str, str]] = []
    for stage in stages:
        figures = stage["figures"]
        if stage["status"] != "pass" or not isinstance(figures.get("steps"), list) or not figures["steps"]:
            continue
        name = stage["stage"]
        curves[name] = [(s["step"], s["loss"]) for s in figures["steps"]]
        if figures.get("control_steps"):
            curves[f"{name}: random-init control"] = [(s["step"], s["loss"]) for s in figures["control_steps"]]
        replacements = figures.get("kernel_replacements")
        if isinstance(replacements, dict) and replacements.get("against_plain"):
            plain = f"{name}: plain kernels (control)"
            curves[plain] = [(s["step"], s["loss_plain"]) for s in replacements["against_plain"]["steps"]]
            pairs.append((name, plain))
    # The recipes trained from the same weights and batches, in name order (train_hf, train_native).
    same_start = tuple(sorted(FROM_FETCHED_WEIGHTS_STAGES))
    if all(name in curves for name in same_start):
        pairs.insert(0, same_start)
    return curves, pairs


def loss_curves_png(stages: list[dict[str, Any]]) -> str | None:
    return _encoded(loss_curves_figure(stages))


def loss_curves_figure(stages: list[dict[str, Any]]):
    """Top: loss per step of every curve, each with its own line style and marker, drawn from large hollow
    markers to small filled ones so that curves lying on each other are all visible. Bottom: the difference
    within each pair expected to coincide, so that "they coincide" is read as a measured zero line, not as a
    curve hidden under another."""
    curves, pairs = loss_series(stages)
    if not curves:
        return None
    plt = _pyplot()
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), dpi=100, height_ratios=(3, 2), sharex=True)
    styles = ("-", "--", "-.", ":")
    markers = ("o", "s", "^", "D", "v", "P", "X", "*")
    count = len(curves)
    for index, (label, points) in enumerate(curves.items()):
        control = "control" in label
        top.plot([p[0] for p in points], [p[1] for p in points], label=label, linestyle=styles[index % len(styles)],
                 marker=markers[index % len(markers)], markersize=4 + 2.0 * (count - index),
                 markerfacecolor="none" if index < count - 1 else None, linewidth=1.0 if control else 1.6,
                 zorder=2 + index)
    top.set_ylabel("loss (nats)")
    top.set_title("Loss per step (torchtitan's metrics), with the controls")
    top.legend(fontsize=7)
    top.grid(alpha=0.3)
    for index, (first, second) in enumerate(pairs):
        a, b = dict(curves[first]), dict(curves[second])
        steps = sorted(a.keys() & b.keys())
        bottom.plot(steps, [a[s] - b[s] for s in steps], marker=markers[index % len(markers)],
                    linestyle=styles[index % len(styles)], label=f"{first} minus {second}")
    bottom.axhline(0.0, color="black", linewidth=0.6)
    bottom.set_xlabel("step")
    bottom.set_ylabel("difference (nats)")
    bottom.set_title("Pairs expected to coincide: their difference per step")
    if pairs:
        bottom.legend(fontsize=7)
    else:
        bottom.text(0.5, 0.5, "no pair expected to coincide in this run", ha="center", transform=bottom.transAxes)
    bottom.grid(alpha=0.3)
    return figure


def router_load_png(stages: list[dict[str, Any]]) -> str | None:
    return _encoded(router_load_figure(stages))


def router_load_figure(stages: list[dict[str, Any]]):
    """Tokens routed to each expert of each MoE layer over the run, relative to an even share (1.0)."""
    moe = next((s for s in stages if s["stage"] == "moe_reduced" and s["status"] == "pass"), None)
    if moe is None or not moe["figures"].get("router_load"):
        return None
    layers = moe["figures"]["router_load"]["per_layer"]
    load = [[count / (sum(layer["tokens_per_expert"]) / len(layer["tokens_per_expert"]))
             for count in layer["tokens_per_expert"]] for layer in layers]
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(9, 1.2 + 0.45 * len(layers)), dpi=100)
    image = axes.imshow(load, aspect="auto", cmap="coolwarm", vmin=0.0, vmax=2.0, interpolation="nearest")
    axes.set_yticks(range(len(layers)), [f"layer {layer['layer']}" for layer in layers])
    axes.set_xlabel("expert")
    axes.set_title(f"{moe['stage']}: tokens routed per expert / even share (1.0 = balanced)")
    figure.colorbar(image, ax=axes, fraction=0.03)
    return figure


def numerics_png(stages: list[dict[str, Any]]) -> str | None:
    return _encoded(numerics_figure(stages))


def numerics_figure(stages: list[dict[str, Any]]):
    """The largest difference from PyTorch per op and dtype (over the shapes checked), with its tolerance; a
    symmetric-log axis so that an exact 0 is drawn, at 0."""
    numerics = next((s for s in stages if s["stage"] == "kernel_numerics" and s["status"] == "pass"), None)
    if numerics is None or not numerics["figures"].get("numerics"):
        return None
    largest: dict[tuple[str, str], dict[str, float]] = {}
    tolerance: dict[tuple[str, str], dict[str, float]] = {}
    for row in numerics["figures"]["numerics"]:
        op = f"{row['section']}: {row['op']}"
        largest.setdefault(op, {})[row["dtype"]] = max(largest.get(op, {}).get(row["dtype"], 0.0), row["max_abs_diff"])
        if row.get("held_to", "max_abs_diff") == "max_abs_diff":  # a bound in ulps is no point on this axis
            tolerance.setdefault(op, {})[row["dtype"]] = row["tolerance"]
    ops = sorted(largest)
    dtypes = sorted({dtype for by_dtype in largest.values() for dtype in by_dtype})
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(8, 1.2 + 0.32 * len(ops) * len(dtypes)), dpi=100)
    for index, dtype in enumerate(dtypes):
        rows = [i * len(dtypes) + index for i, op in enumerate(ops) if dtype in largest[op]]
        present = [op for op in ops if dtype in largest[op]]
        axes.scatter([largest[op][dtype] for op in present], rows, marker="o", label=f"{dtype}: largest |diff|",
                     zorder=3)
        bounded = [(tolerance[op][dtype], row) for op, row in zip(present, rows, strict=True)
                   if dtype in tolerance.get(op, {})]
        if bounded:
            axes.scatter(*zip(*bounded, strict=True), marker="|", s=200, label=f"{dtype}: tolerance")
    axes.set_yticks([i * len(dtypes) + j for i in range(len(ops)) for j in range(len(dtypes))],
                    [f"{op} ({dtype})" for op in ops for dtype in dtypes], fontsize=7)
    axes.set_xscale("symlog", linthresh=1e-9)
    axes.set_xlabel("max |kernel - PyTorch| (symlog; 0 = exact)")
    axes.set_title("Kernel numerics per op and dtype")
    axes.invert_yaxis()
    axes.legend(fontsize=7, loc="lower right")
    axes.grid(alpha=0.3, axis="x")
    return figure


def benchmark_png(stages: list[dict[str, Any]]) -> str | None:
    return _encoded(benchmark_figure(stages))


def benchmark_figure(stages: list[dict[str, Any]]):
    """Step time per step of each benchmarked recipe, one panel per recipe, a line per run (eager,
    plain kernels, compiled with a cold and a warm cache), the warm-up steps shaded; log scale, so that a
    compiled step 1 of tens of seconds and steady steps of a tenth of one share the axis."""
    bench = next((s for s in stages if s["stage"] == "benchmark" and s["status"] == "pass"), None)
    if bench is None or not bench["figures"].get("step_times"):
        return None
    recipes: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for row in bench["figures"]["step_times"]:
        recipes.setdefault(row["recipe"], {}).setdefault(row["run"], []).append(row)
    warmup = bench["figures"]["warmup_steps"]
    plt = _pyplot()
    figure, panels = plt.subplots(len(recipes), 1, figsize=(8, 3.2 * len(recipes)), dpi=100, squeeze=False)
    markers = {"eager": "o", "plain": "s", "compiled_cold": "^", "compiled_warm": "v"}
    for axes, (name, runs) in zip(panels[:, 0], recipes.items(), strict=True):
        axes.axvspan(0.5, warmup + 0.5, color="0.9", label="warm-up")
        for variant, points in runs.items():
            axes.plot([p["step"] for p in points], [p["step_time_s"] for p in points], marker=markers.get(variant, "o"),
                      markersize=4, label=variant)
        axes.set_yscale("log")
        axes.set_title(f"{name}: step time per step")
        axes.set_xlabel("step")
        axes.set_ylabel("seconds (log)")
        axes.legend(fontsize=7)
        axes.grid(alpha=0.3)
    return figure


def bandwidth_png(stages: list[dict[str, Any]]) -> str | None:
    return _encoded(bandwidth_figure(stages))


def by_collective(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    collectives: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        collectives.setdefault(row["collective"], []).append(row)
    return collectives


def bandwidth_figure(stages: list[dict[str, Any]]):
    """Bus bandwidth of each collective against its size, as verify_ranks timed them (log-log), each collective's
    floor dashed over the sizes held to it, and nccom-test's figures dotted where it ran."""
    ranks = next((s for s in stages if s["stage"] == "verify_ranks" and s["status"] == "pass"), None)
    figures = (ranks or {}).get("figures", {})
    rows = figures.get("live", {}).get("bandwidth")
    if not rows:
        return None
    vendor = by_collective((figures.get("vendor_collectives") or {}).get("bandwidth", []))
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(8, 3.6), dpi=100)
    for (name, points), marker in zip(by_collective(rows).items(), "os^v", strict=False):
        line, = axes.plot([p["size_mib"] for p in points], [p["busbw_gbps"] for p in points], marker=marker, label=name)
        held = [p for p in points if p.get("floor_gbps") is not None]
        if held:
            axes.plot([p["size_mib"] for p in held], [p["floor_gbps"] for p in held], linestyle="--",
                      color=line.get_color(), label=f"{name} floor")
        if name in vendor:
            axes.plot([p["size_mib"] for p in vendor[name]], [p["busbw_gbps"] for p in vendor[name]], linestyle=":",
                      marker=marker, fillstyle="none", color=line.get_color(), label=f"{name} (nccom-test)")
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xlabel("size (MiB, log)")
    axes.set_ylabel("bus bandwidth (GB/s, log)")
    live = ranks["figures"]["live"]
    axes.set_title(f"Collectives over {live['ranks_seen']} {live['dist_backend']} ranks: bus bandwidth per size")
    axes.legend(fontsize=7)
    axes.grid(alpha=0.3)
    return figure


def convergence_png(stages: list[dict[str, Any]]) -> str | None:
    return _encoded(convergence_figure(stages))


def convergence_figure(stages: list[dict[str, Any]]):
    """The convergence run's training loss per step and its held-out loss at each evaluation."""
    run = next((s for s in stages if s["stage"] == "convergence" and s["status"] == "pass"), None)
    if run is None:
        return None
    figures = run["figures"]
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(8, 3.6), dpi=100)
    train, heldout = figures["train_loss"], figures["heldout_loss"]
    axes.plot([p["step"] for p in train], [p["loss"] for p in train], linewidth=1.0, label="training (its batch)")
    axes.plot([p["step"] for p in heldout], [p["loss"] for p in heldout], marker="o", linewidth=1.8,
              label=f"held-out ({figures['eval_batches']} batches per evaluation)")
    axes.set_xlabel("step")
    axes.set_ylabel("loss (nats)")
    axes.set_title(f"Convergence: {figures['recipe']} for {figures['steps_trained']} steps from the fetched weights")
    axes.legend(fontsize=7)
    axes.grid(alpha=0.3)
    return figure


# Figures a plot draws in full, by the stage (and the plot's place in the report): the page shows the plot
# instead of tabling them; report.json keeps them.
DRAWN_IN_FULL: dict[str, tuple[str, ...]] = {"benchmark": ("step_times",), "convergence": ("train_loss",)}


def report_plots(stages: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """The plots this run has data for, by where the report shows them: "overview" (the loss curves) or the
    stage whose figures they draw; each with its alt text."""
    drawn = {
        "overview": ("loss per step of the training stages, with their controls", loss_curves_png(stages)),
        "moe_reduced": ("router load per expert per layer", router_load_png(stages)),
        "kernel_numerics": ("kernel numerics per op and dtype", numerics_png(stages)),
        "benchmark": ("step time per step of each benchmarked recipe and run", benchmark_png(stages)),
        "verify_ranks": ("bus bandwidth of each collective against its size", bandwidth_png(stages)),
        "convergence": ("training and held-out loss per step of the convergence run", convergence_png(stages)),
    }
    return {where: {"alt": alt, "png": png} for where, (alt, png) in drawn.items() if png}
