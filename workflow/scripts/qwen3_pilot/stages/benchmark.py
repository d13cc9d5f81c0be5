"""Stage benchmark: per configured recipe, warm-up and steady state measured apart in one trainer run; with
kernel replacements the same run without them; for the compile recipes the same run under torch.compile
with an empty compile cache, then with the cache that run left (and, where eager mode compiles too, the eager
run with an empty cache of its own): measured.json. Its judge (judge_benchmark, in rule judge) flags the noisy
steady phases and prices the steady state and the warm-up, so that an edit to benchmark.noisy_cv or the price
measures nothing again."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from ..benchmark_runs import (
    compile_backend,
    compile_cache_folder,
    compile_effect,
    cost,
    kernel_effect,
    projection,
    run_changes,
    run_figures,
    run_paths,
    table_row,
    variants,
)
from ..reduced_moe import model_spec, reduced_moe_changes
from ..stage_progress import record_measured
from ..titan.parity import read_checkpoint_values
from ..trainer_run import METRICS_FILE, PARITY_FILE, ROUTER_LOAD_FILE
from ..training import (
    CONFIG_FUNCTIONS,
    launch_and_read,
    ranks_peak_flops,
    trainer_run,
    usable_backend,
)

STAGE = "benchmark"


def run(
    *, backend_config: dict[str, Any], dataset: str, training: dict[str, Any], moe: dict[str, Any],
    kernels: dict[str, list[dict[str, str]]], settings: dict[str, Any], cache_root: str, checkpoint_dir: Path,
    corpus_dir: Path, ranks_summary: Path, out_dir: Path, measured_path: Path, log_path: Path,
) -> dict[str, Any]:
    from ..summary import StageMeasurement

    backend = usable_backend(STAGE, backend_config, cache_root)
    peak = ranks_peak_flops(ranks_summary)
    warmup, measured = settings["warmup_steps"], settings["measured_steps"]
    bench_training = {**training, "steps": warmup + measured}
    vocab_size = read_checkpoint_values(checkpoint_dir)["vocab_size"]
    table, step_times, compiled, kernel_rows, artifacts = [], [], [], [], []
    for name in settings["recipes"]:
        folder = out_dir / name
        folder.mkdir(parents=True, exist_ok=True)
        runs: dict[str, dict[str, Any]] = {}
        for variant, replacements, compiled_with in variants(name, kernels[name], settings, backend.compile_backend):
            recipe_path, run_dir, launch_name = run_paths(out_dir, name, variant)
            trainer = trainer_run(
                stage=name, backend=backend, checkpoint=checkpoint_dir, corpus_dir=corpus_dir, dataset=dataset,
                training=bench_training, peak_flops_per_rank=peak, parity_path=folder / PARITY_FILE,
                replacements=replacements, lnc=backend_config["neuron"]["lnc"],
            ).replace(**run_changes(compiled_with))
            if name == "moe_reduced":
                spec = model_spec(moe, moe["width"], vocab_size, training["seq_len"])
                trainer = trainer.replace(**reduced_moe_changes(spec, run_dir / ROUTER_LOAD_FILE))
            launch, steps = launch_and_read(
                f"{STAGE} {name} ({variant})", backend, trainer, config_function=CONFIG_FUNCTIONS[name],
                recipe_path=recipe_path, run_dir=run_dir, log_path=log_path,
                extra_env=compile_cache(backend, folder, variant), launch_name=launch_name,
            )
            lines = [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]
            runs[variant] = run_figures(steps, lines, launch.started_at, warmup=warmup, ranks=backend.ranks_per_node,
                                        peak_flops_per_rank=peak)
            table.append({**table_row(name, variant, runs[variant]), "launch_wall_s": round(launch.wall_s, 2)})
            step_times += [{"recipe": name, "run": variant, **step} for step in runs[variant]["per_step"]]
            artifacts += [recipe_path, run_dir / METRICS_FILE]
            record_measured(table=table, step_times=step_times)
        if "plain" in runs:
            kernel_rows.append({"recipe": name, **kernel_effect(runs["eager"], runs["plain"])})
        if "compiled_cold" in runs:
            compiled.append({"recipe": name,
                             **compile_effect(runs["eager"], runs["compiled_cold"], runs["compiled_warm"]),
                             "time_to_step1_s_cold": runs["compiled_cold"]["time_to_step1_s"],
                             "time_to_step1_s_warm": runs["compiled_warm"]["time_to_step1_s"]})
    notes = [f"COMPILE CACHE: {row['recipe']}: the warm-cache compiled run reached step 1 in "
              f"{row['time_to_step1_s_warm']:.1f} s, not below the cold one's {row['time_to_step1_s_cold']:.1f} s"
              for row in compiled if not row["warm_below_cold"]]
    measurement = StageMeasurement(
        stage=STAGE,
        backend=backend.name,
        figures={
            "table": table,
            "compile": compiled or "no compile recipe (benchmark.compile_recipes)",
            "kernels": kernel_rows or "no recipe with kernel replacements",
            "step_times": step_times,
            "warmup_steps": warmup,
            "measured_steps": measured,
            "ranks": backend.expected_ranks,
            "peak_flops_per_rank": peak,
            "peak_flops_source": backend.peak_flops_source,
            "compile_backend": compile_backend(settings, backend.compile_backend),
            "eager_compiles": backend.eager_compiles,
        },
        notes=notes,
    )
    measurement.add_artifacts(artifacts)
    return measurement.write(measured_path)


def judge_benchmark(stage: str, figures: dict[str, Any], judging: dict[str, Any], backend: str) -> dict[str, Any]:
    """The benchmark's measured runs judged (rule judge): each steady phase flagged noisy above
    benchmark.noisy_cv, and with benchmark.cost the eager runs priced at benchmark.price_per_hour. Fills
    `figures`; returns proves, does_not_prove and the notes of the noisy runs."""
    noisy_cv = judging["noisy_cv"]
    for row in figures["table"]:
        row["noisy"] = row["cv"] > noisy_cv
    figures["noisy_cv"] = noisy_cv
    price, budget = judging["price"], judging["budget"]
    eager = [row for row in figures["table"] if row["run"] == "eager"]
    figures["price"] = price if price["per_hour"] is not None else NO_PRICE
    figures["cost"] = [
        {"recipe": row["recipe"], **cost(price["per_hour"], row["tokens_per_s_per_instance"], row["warmup_phase_s"])}
        for row in eager
    ] if price["per_hour"] is not None else NO_PRICE
    figures["projection"] = projected(figures, eager, price, budget, backend)
    warmup, measured, ranks = figures["warmup_steps"], figures["measured_steps"], figures["ranks"]
    return {
        "notes": [f"NOISY: {row['recipe']} ({row['run']}): steady step time varies by {row['cv']:.0%} (coefficient "
                  f"of variation above benchmark.noisy_cv = {noisy_cv})" for row in figures["table"] if row["noisy"]],
        "proves": (
            f"What a step of each recipe cost on this machine's {ranks} {backend} ranks in "
            f"this run: time to the end of step 1 (startup and compilation included), each of {warmup} warm-up "
            f"steps, and over {measured} steady steps the median, p10, p90 and spread of the step time, tokens/s, "
            "TFLOPS and MFU against the peak named here, peak memory per rank and the share of time spent waiting "
            f"for data; compiled ({figures['compile_backend']}) against eager with an empty and a warm compile "
            "cache; replaced kernels against plain. The compile cost at step 1 (compiled cold - eager) compares "
            + ("two cold runs: the eager run compiles too and starts from an empty compile cache of its own."
               if figures["eager_compiles"] else "the cold compiled run with an eager run, which compiles nothing.")
        ),
        "does_not_prove": (
            ("A CPU step time predicts nothing about a trn2, and MFU here is against a measured CPU matmul peak. "
             if backend == "cpu" else "")
            + "The reduced MoE is not Qwen3-30B-A3B. The runs start from random init, so the figures say nothing "
            "about loss. One run per variant: a figure that moves by less than its run's spread (p10 to p90) "
            "between two reports is noise, not a change."
        ),
    }


NO_PRICE = ("not priced: set benchmark.price.per_hour with its kind, region, as_of and source (no price is "
            "built in)")


def projected(figures: dict[str, Any], eager: list[dict[str, Any]], price: dict[str, Any], budget: dict[str, Any],
              backend: str) -> dict[str, Any] | str:
    """The full run benchmark.budget describes, per benchmarked recipe and scaling efficiency, with the basis
    every figure rests on; a sentence naming what to set when there is no budget."""
    if budget["tokens"] is None:
        return ("not projected: set benchmark.budget.tokens (the full run's tokens; benchmark.budget.instances and "
                "benchmark.price.per_hour for its cost)")
    basis = (f"A linear projection from a pilot of {figures['measured_steps']} steady steps of each recipe on "
             f"{figures['ranks']} {backend} ranks of one instance (eager, random init): {budget['tokens']:,.0f} "
             f"tokens on {budget['instances']} instance(s), each paying the measured warm-up once, at each scaling "
             "efficiency shown (assumed, not measured: the pilot runs one instance)"
             + ("; no cost: benchmark.price.per_hour is not set." if price["per_hour"] is None else
                f"; cost at {price['per_hour']:g} {price['currency']} per instance-hour ({price['kind']}, "
                f"{price['region']}, as of {price['as_of']}; {price['source']})."))
    rows = [{"recipe": row["recipe"], **projection(budget["tokens"], budget["instances"], efficiency,
                                                   row["tokens_per_s_per_instance"], row["warmup_phase_s"],
                                                   price["per_hour"])}
            for row in eager for efficiency in budget["scaling_efficiencies"]]
    return {"basis": basis, "rows": rows}


def compile_cache(backend, folder: Path, variant: str) -> dict[str, str]:
    """A fresh compile cache per measurement that compiles: empty for the cold run (and for the eager one
    where eager mode compiles too), a copy of what the cold run left for the warm one, so that none sees an
    earlier run's graphs."""
    target = compile_cache_folder(folder, variant, backend.eager_compiles)
    if target is None:
        return {}
    shutil.rmtree(target, ignore_errors=True)
    if variant == "compiled_warm":
        shutil.copytree(compile_cache_folder(folder, "compiled_cold"), target)
    target.mkdir(parents=True, exist_ok=True)
    return backend.compile_cache_env(target)
