"""Stages train_hf and train_native, measuring: one recipe trained from the fetched weights, a random-init control
on the same batch (launched twice where config training.repeat lists the recipe) and, with kernel replacements, the
same run without them; measured.json holds what they measured and rule judge holds it to the configured thresholds
(stages/judge.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..launch import Launch
from ..recipe_registry import recipe_of
from ..stage_progress import record_measured
from ..titan.parity import read_checkpoint_values
from ..trainer_run import METRICS_FILE, PARITY_FILE, export_dir
from ..training import (
    CONTROL_RECIPE,
    PLAIN_RECIPE,
    control_run,
    export_files,
    launch_and_read,
    ranks_peak_flops,
    repeat_figures,
    replaced_and_plain,
    trainer_run,
    usable_backend,
)


def run(
    *, stage: str, backend_config: dict[str, Any], dataset: str, training: dict[str, Any], kernels: dict[str, Any],
    cache_root: str, checkpoint_dir: Path, corpus_dir: Path, ranks_record: Path, recipe_path: Path, run_dir: Path,
    control_dir: Path, plain_dir: Path, repeat_dir: Path, measured_path: Path, log_path: Path, repeat_steps: int = 0,
) -> dict[str, Any]:
    from ..summary import StageMeasurement

    backend = usable_backend(stage, backend_config, cache_root)
    checkpoint = read_checkpoint_values(checkpoint_dir)  # config.json problems fail before any launch
    peak = ranks_peak_flops(ranks_record)
    parity_path = recipe_path.with_name(PARITY_FILE)
    trainer = trainer_run(
        stage=stage, backend=backend, checkpoint=checkpoint_dir, corpus_dir=corpus_dir, dataset=dataset,
        training=training, peak_flops_per_rank=peak, parity_path=parity_path, replacements=kernels["rules"],
    )
    control_recipe = recipe_path.with_name(CONTROL_RECIPE)
    runs: dict[str, Launch] = {}
    steps: dict[str, list[dict[str, Any]]] = {}
    control = control_run(trainer, repeat_steps)
    repeat_dir.mkdir(parents=True, exist_ok=True)  # empty unless the control is launched twice
    launches = [("fetched weights", run_dir, trainer, recipe_path),
                ("random-init control", control_dir, control, control_recipe)]
    if repeat_steps:
        # The same recipe file launched again: the same seed, batches and steps from the same random init.
        launches.append(("random-init control, again", repeat_dir, control, control_recipe))
    for name, folder, run, path in launches:
        runs[name], steps[name] = launch_and_read(
            f"{stage} ({name})", backend, run, config_function=recipe_of(stage).config_function, recipe_path=path,
            run_dir=folder, log_path=log_path,
        )
    loaded, control_steps = steps["fetched weights"], steps["random-init control"]
    repeat = repeat_figures(control_steps, steps["random-init control, again"]) if repeat_steps else None
    record_measured(steps=loaded, control_steps=control_steps, repeat=repeat)
    exported = export_files(stage, run_dir, training["steps"])
    parity = json.loads(parity_path.read_text())
    built_layers = next(row["built"] for row in parity["rows"] if row["field"] == "num_hidden_layers")
    replacements = replaced_and_plain(
        stage, backend, trainer, config_function=recipe_of(stage).config_function, recipe_path=recipe_path,
        run=runs["fetched weights"], steps=loaded, plain_dir=plain_dir, log_path=log_path, n_layers=built_layers,
    )
    steady = [s for s in loaded if s["step"] > 1]
    measurement = StageMeasurement(
        stage=stage,
        backend=backend.name,
        figures={
            "steps_trained": len(loaded),
            "ranks": backend.expected_ranks,
            "dist_backend": backend.dist_backend,
            "vocab_size": checkpoint["vocab_size"],
            "parity": parity["rows"],
            "final_loss": loaded[-1]["loss"],
            "mean_step_time_s_after_step_1": _mean(s["step_time_s"] for s in steady),
            "mean_tokens_per_s_after_step_1": _mean(s["tokens_per_s"] for s in steady),
            "mean_mfu_pct_after_step_1": _mean(s["mfu_pct"] for s in steady),
            "peak_memory_gib": max(s["peak_memory_gib"] for s in loaded),
            "peak_flops_per_rank": peak,
            "peak_flops_source": backend.peak_flops_source,
            "launch_wall_s": {name: round(run.wall_s, 2) for name, run in runs.items()},
            "steps": loaded,
            "control_steps": control_steps,
            # The control launched twice (training.repeat): rule judge holds the losses to its tolerance.
            "repeat": repeat or "not repeated (training.repeat.recipes)",
            "export_dir": export_dir(run_dir, training["steps"]).as_posix(),
            "kernel_replacements": replacements or "none configured (kernels." + stage + ")",
        },
    )
    plain = [recipe_path.with_name(PLAIN_RECIPE), plain_dir / METRICS_FILE] if replacements else []
    repeated = [repeat_dir / METRICS_FILE] if repeat_steps else []
    measurement.add_artifacts([recipe_path, control_recipe, parity_path, run_dir / METRICS_FILE,
                               control_dir / METRICS_FILE, *repeated, *plain, *exported])
    return measurement.write(measured_path)


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None
