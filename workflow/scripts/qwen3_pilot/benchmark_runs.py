"""The benchmark stage's arithmetic (torch-free): a run's per-step metrics (training.read_steps) split into
warm-up and steady state, the steady phase's statistics, MFU against the backend's peak, compile and
kernel comparisons, and cost from a user-supplied price. Every figure comes from the steps handed in.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any


class BenchmarkError(ValueError):
    pass


def split_phases(steps: list[dict[str, Any]], warmup: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(warm-up steps, steady steps): the first `warmup` steps by step number, then the rest. Steady state
    never includes a warm-up step, whatever order the records came in."""
    ordered = sorted(steps, key=lambda s: s["step"])
    if len(ordered) <= warmup:
        raise BenchmarkError(f"{len(ordered)} steps logged, {warmup} of them warm-up: no steady step to measure")
    return ordered[:warmup], ordered[warmup:]


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), linear between the closest ranks (numpy's default method)."""
    if not values:
        raise BenchmarkError("percentile of no values")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _finite(values) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def steady_state(
    steps: list[dict[str, Any]], *, warmup: int, ranks: int, peak_flops_per_rank: float,
) -> dict[str, Any]:
    """The steady phase's figures: step time (median, p10, p90, coefficient of variation), tokens/s per rank
    (torchtitan's throughput is per rank) and per instance, TFLOPS and MFU per rank, peak memory per rank over
    the whole run, and the share of step time spent waiting for data."""
    warm, steady = split_phases(steps, warmup)
    times = _finite(s["step_time_s"] for s in steady)
    if not times:
        raise BenchmarkError("no steady step logged a finite step time")
    mean = statistics.fmean(times)
    cv = statistics.pstdev(times) / mean if len(times) > 1 and mean > 0 else 0.0
    tokens_per_rank = statistics.median(_finite(s["tokens_per_s"] for s in steady))
    tflops = statistics.median(_finite(s["tflops"] for s in steady))
    data_wait = _finite(s.get("data_wait_pct") for s in steady)
    return {
        "warmup_steps": [s["step"] for s in warm],
        "steady_steps": len(steady),
        "step_time_s": {
            "median": statistics.median(times), "p10": percentile(times, 10), "p90": percentile(times, 90),
            "mean": mean, "cv": cv,
        },
        "tokens_per_s_per_rank": tokens_per_rank,
        "tokens_per_s_per_instance": tokens_per_rank * ranks,
        "tflops_per_rank": tflops,
        "mfu_pct": mfu_pct(tflops, peak_flops_per_rank),
        "peak_memory_gib_per_rank": max(_finite(s["peak_memory_gib"] for s in steps), default=None),
        "data_wait_pct": statistics.fmean(data_wait) if data_wait else None,
        "warmup_step_time_s": [s["step_time_s"] for s in warm],
    }


def mfu_pct(tflops_per_rank: float, peak_flops_per_rank: float) -> float:
    """Model FLOPS utilisation in percent: achieved TFLOPS per rank against the backend's peak per rank."""
    if not peak_flops_per_rank > 0:
        raise BenchmarkError(f"peak FLOPS per rank = {peak_flops_per_rank}: MFU needs a positive peak")
    return 100 * tflops_per_rank * 1e12 / peak_flops_per_rank


def relative(new: float, old: float) -> float | None:
    """(new - old) / old, or None without a positive base."""
    return (new - old) / old if old else None


# ---- one run's figures, and the comparisons between runs ----

def run_changes(compile_backend: str | None) -> dict[str, Any]:
    """What a benchmark run changes in its recipe's TrainerRun: no checkpoint (random init computes the same step
    as the fetched weights, and saving an export would add its time to the last step), and torch.compile with
    `compile_backend` or eager. Used by the stage and by the preflight."""
    return {"use_checkpoint": False, "compile_backend": compile_backend}


def compile_backend(settings: dict[str, Any], backends_own: str) -> str:
    """torch.compile's backend in the compiled runs: benchmark.compile_backend, or for "default" the backend's own
    (Backend.compile_backend)."""
    return backends_own if settings["compile_backend"] == "default" else settings["compile_backend"]


def variants(
    recipe: str, rules: list[dict[str, str]], settings: dict[str, Any], backends_own: str
) -> list[tuple[str, list, str | None]]:
    """The runs of one benchmarked recipe: (name, kernel replacements, torch.compile backend or None for eager).
    Eager with the recipe's kernel replacements; plain without them, when it has any; compiled (compile_backend)
    with a cold and then a warm compile cache, for the compile recipes. Used by the stage and by the preflight."""
    runs: list[tuple[str, list, str | None]] = [("eager", rules, None)]
    if rules:
        runs.append(("plain", [], None))
    if recipe in settings["compile_recipes"]:
        compiled_with = compile_backend(settings, backends_own)
        runs += [("compiled_cold", rules, compiled_with), ("compiled_warm", rules, compiled_with)]
    return runs


def run_paths(runs_dir: Path, recipe: str, variant: str) -> tuple[Path, Path, str]:
    """One benchmark run's recipe file, run folder and launch name (its ranks' log folder), for the stage and
    the preflight alike."""
    folder = Path(runs_dir) / recipe
    return folder / f"recipe.{variant}.json", folder / variant, f"{recipe}-{variant}"


def compile_cache_folder(recipe_dir: Path, variant: str, eager_compiles: bool = False) -> Path | None:
    """The compile cache of a run that compiles: its own folder per measurement (cold, warm), and one each for
    the eager and plain runs where eager mode compiles too (neuron: Backend.eager_compiles), so that every
    step 1 compared (cold - eager, eager - plain) starts from an empty cache, never the one an earlier stage
    warmed; none for eager or plain elsewhere."""
    if variant in ("eager", "plain") and eager_compiles:
        return Path(recipe_dir) / "compile_cache" / variant
    if not variant.startswith("compiled_"):
        return None
    return Path(recipe_dir) / "compile_cache" / variant.removeprefix("compiled_")


def logged_at(metrics_lines: list[dict[str, Any]], step: int) -> float:
    """When rank 0 logged `step` (wall clock, titan_metrics' `logged_at`)."""
    for record in metrics_lines:
        if int(record["step"]) == step and "logged_at" in record:
            return float(record["logged_at"])
    raise BenchmarkError(f"no wall-clock time logged for step {step}")


def run_figures(
    steps: list[dict[str, Any]], metrics_lines: list[dict[str, Any]], started_at: float, *, warmup: int,
    ranks: int, peak_flops_per_rank: float,
) -> dict[str, Any]:
    """One benchmark run: time to the end of step 1 from the launch (startup and compilation included),
    the warm-up phase's length, the steady state, and each step's time with its phase."""
    return {
        "time_to_step1_s": logged_at(metrics_lines, 1) - started_at,
        "warmup_phase_s": logged_at(metrics_lines, warmup) - started_at,
        **steady_state(steps, warmup=warmup, ranks=ranks, peak_flops_per_rank=peak_flops_per_rank),
        "per_step": [{"step": s["step"], "step_time_s": s["step_time_s"],
                      "phase": "warm-up" if s["step"] <= warmup else "steady"}
                     for s in sorted(steps, key=lambda s: s["step"])],
    }


def compile_effect(eager: dict[str, Any], cold: dict[str, Any], warm: dict[str, Any]) -> dict[str, Any]:
    """What compiling costs at step 1 (cold cache against eager: two cold runs where eager compiles too, each
    from an empty cache of its own), what the cache the cold run left saves
    (warm against cold), and what compiling gains per steady step (eager against warm)."""
    gain = eager["step_time_s"]["median"] - warm["step_time_s"]["median"]
    return {
        "compile_cost_at_step1_s": cold["time_to_step1_s"] - eager["time_to_step1_s"],
        "cache_saving_at_step1_s": cold["time_to_step1_s"] - warm["time_to_step1_s"],
        "warm_below_cold": warm["time_to_step1_s"] < cold["time_to_step1_s"],
        "steady_gain_per_step_s": gain,
        "steady_gain_relative": gain / eager["step_time_s"]["median"] if eager["step_time_s"]["median"] else None,
    }


def kernel_effect(replaced: dict[str, Any], plain: dict[str, Any]) -> dict[str, Any]:
    """Steady step time and peak memory with the kernel replacements against the same run without them."""
    return {
        "median_step_s_replaced": replaced["step_time_s"]["median"],
        "median_step_s_plain": plain["step_time_s"]["median"],
        "step_time_relative": relative(replaced["step_time_s"]["median"], plain["step_time_s"]["median"]),
        "peak_memory_gib_replaced": replaced["peak_memory_gib_per_rank"],
        "peak_memory_gib_plain": plain["peak_memory_gib_per_rank"],
    }


def table_row(recipe: str, variant: str, run: dict[str, Any]) -> dict[str, Any]:
    """One line of the report's table per recipe and run."""
    times = run["step_time_s"]
    return {
        "recipe": recipe, "run": variant, "time_to_step1_s": run["time_to_step1_s"],
        "warmup_steps_s": run["warmup_step_time_s"], "warmup_phase_s": run["warmup_phase_s"],
        "steady_steps": run["steady_steps"], "median_step_s": times["median"],
        "p10_s": times["p10"], "p90_s": times["p90"], "cv": times["cv"],
        "tokens_per_s_per_rank": run["tokens_per_s_per_rank"],
        "tokens_per_s_per_instance": run["tokens_per_s_per_instance"],
        "tflops_per_rank": run["tflops_per_rank"], "mfu_pct": run["mfu_pct"],
        "peak_memory_gib_per_rank": run["peak_memory_gib_per_rank"], "data_wait_pct": run["data_wait_pct"],
    }
