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
    kernel_effect,
    run_changes,
    run_figures,
    run_paths,
    table_row,
    variants,
)
from ..recipe_registry import recipe_of
from ..reduced_moe import model_spec, reduced_moe_changes
from ..stage_progress import record_measured
from ..titan.parity import read_checkpoint_values
from ..trainer_run import METRICS_FILE, PARITY_FILE, ROUTER_LOAD_FILE
from ..training import (
    launch_and_read,
    ranks_peak_flops,
    trainer_run,
    usable_backend,
)

STAGE = "benchmark"


def run(
    *, backend_config: dict[str, Any], dataset: str, training: dict[str, Any], moe: dict[str, Any],
    kernels: dict[str, list[dict[str, str]]], settings: dict[str, Any], cache_root: str, checkpoint_dir: Path,
    corpus_dir: Path, ranks_record: Path, out_dir: Path, measured_path: Path, log_path: Path,
) -> dict[str, Any]:
    from ..summary import StageMeasurement

    backend = usable_backend(STAGE, backend_config, cache_root)
    peak = ranks_peak_flops(ranks_record)
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
                replacements=replacements,
            ).replace(**run_changes(compiled_with))
            if name == "moe_reduced":
                spec = model_spec(moe, moe["width"], vocab_size, training["seq_len"])
                trainer = trainer.replace(**reduced_moe_changes(spec, run_dir / ROUTER_LOAD_FILE))
            launch, steps = launch_and_read(
                f"{STAGE} {name} ({variant})", backend, trainer, config_function=recipe_of(name).config_function,
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
