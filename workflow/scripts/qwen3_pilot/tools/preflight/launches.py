"""The preflight's launch plan (its step 5): the exact command and environment of every neuron stage that uses the
device, built by the same functions the stages launch with."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ...parse_time.config import stage_kernel_rules, stage_repeat_steps
from ...problems import problem_list
from ...recipe_registry import RECIPES, recipe_of
from . import PreflightError


def launch_plan(config: dict[str, Any], backend, project: Path, configfiles: list[Path]) -> list[dict[str, Any]]:
    """The command and added environment of every neuron stage that uses the device: each torchrun launch,
    built by the same functions the stages launch with, at the paths the workflow gives them, and
    kernel_numerics, which uses the device in the stage's own process (its command: the Snakemake run of that
    stage alone, with the configuration files the preflight checked). Refused, naming each, where this
    environment would break the launches (the backend's launch_environment_problems)."""
    from ...backends.neuron import launch_environment_problems
    from ...ranks import rank_worker_command
    from ...training import (
        CONTROL_RECIPE,
        PLAIN_CHANGES,
        PLAIN_RECIPE,
        control_changes,
        trainer_launch,
    )

    problems = launch_environment_problems(config)
    if problems:
        raise PreflightError(problem_list("the launching environment", problems))

    python, results, logs = sys.executable, project / "results", project / "logs"
    launches = [{
        "stage": "verify_ranks", "launch": "ranks",
        "command": rank_worker_command(backend, backend.ranks_per_node, results / "verify_ranks" / "ranks", python,
                                       backend.rank_log_dir(logs / "verify_ranks" / "verify_ranks.log", "ranks"),
                                       config["verify_ranks"]["collectives"]),
        "env": backend.launcher_env,
    }, {
        # Snakemake runs the stage's script in one process on one node, which sets this environment itself
        # (stages/kernel_numerics/) before it loads the kernels; the script reads its settings from Snakemake,
        # so the command a person can run is the stage's own target (after its pin_env stamps).
        "stage": "kernel_numerics", "launch": "stage process (no torchrun)",
        "command": ["snakemake", "--cores", "1", *(arg for path in configfiles for arg in ("--configfile", str(path))),
                    "results/kernel_numerics/measured.json"],
        "env": backend.device_process_env,
    }]
    # What each launch changes in the stage's own recipe (every setting reaches the ranks in its TrainerRun file).
    for recipe in RECIPES:
        stage = recipe.stage
        kinds = [("run", "recipe.json", {})]
        if recipe.from_fetched_weights:
            repeat_steps = stage_repeat_steps(config, stage)
            kinds.append(("control", CONTROL_RECIPE, control_changes(repeat_steps)))
            if repeat_steps:  # the same control again (training.repeat)
                kinds.append(("repeat", CONTROL_RECIPE, control_changes(repeat_steps)))
        if stage_kernel_rules(config, stage):
            kinds.append(("plain", PLAIN_RECIPE, PLAIN_CHANGES))
        for kind, recipe_file, settings in kinds:
            command, env = trainer_launch(
                backend, backend.ranks_per_node, recipe.config_function, results / stage / recipe_file,
                results / stage / kind, python, rank_log_dir=backend.rank_log_dir(logs / stage / f"{stage}.log", kind),
            )
            launches.append({"stage": stage, "launch": kind, "command": command, "env": env, "run": settings})
    launches += benchmark_launches(config, backend, results, logs)
    return launches


def benchmark_launches(config: dict[str, Any], backend, results: Path, logs: Path) -> list[dict[str, Any]]:
    """The benchmark stage's launches: per recipe and run, with the compile backend and the fresh compile
    cache folder of each measurement that compiles (the eager one too on neuron)."""
    from ...benchmark_runs import compile_cache_folder, run_changes, run_paths, variants
    from ...training import trainer_launch

    launches = []
    runs_dir = results / "benchmark" / "runs"
    for recipe in config["benchmark"]["recipes"]:
        rules = stage_kernel_rules(config, recipe)
        for variant, replaced, compile_backend in variants(recipe, rules, config["benchmark"], backend.compile_backend):
            recipe_path, run_dir, launch_name = run_paths(runs_dir, recipe, variant)
            cache = compile_cache_folder(run_dir.parent, variant, backend.eager_compiles)
            command, env = trainer_launch(
                backend, backend.ranks_per_node, recipe_of(recipe).config_function, recipe_path, run_dir,
                sys.executable, rank_log_dir=backend.rank_log_dir(logs / "benchmark" / "benchmark.log", launch_name),
                extra_env=backend.compile_cache_env(cache) if cache else None,
            )
            settings = {**run_changes(compile_backend), "replacements": replaced}
            launches.append({"stage": "benchmark", "launch": f"{recipe} {variant}", "command": command, "env": env,
                             "run": settings})
    return launches
