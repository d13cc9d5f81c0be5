"""What the training stages (stages/train.py, stages/moe_reduced.py, stages/benchmark.py) share: the recipe
file, the trainer launch, torchtitan's per-step metrics, and the kernel replacements' launch-log count and plain
twin run.

Torch-free: the training happens in torchrun's processes (qwen3_pilot.titan.in_ranks: train_entry and recipes); this
module writes the recipe, launches and reads what the run measured. What judges it (the loaded-weights gate, the
losses against the plain run) is stages/train_judging.py, which this module never imports: a stage's code decides
its reruns (parse_time/code.py).
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .artifacts import write_json
from .backends import Backend
from .launch import Launch, failure_cause, how_it_ended, run_torchrun, stop_orphans
from .paths import RunFolder
from .problems import problem_list
from .trainer_run import LAUNCH_RECORD, METRICS_FILE, RECIPE_ENV, TrainerRun, TrainingError, export_dir

# Beside a stage's recipe.json (its TrainerRun): the same run without kernel replacements, and the random-init
# control (launched twice, into control/ and repeat/, where config training.repeat lists the recipe).
PLAIN_RECIPE = "recipe.plain.json"
CONTROL_RECIPE = "recipe.control.json"
# What each of those runs changes in the stage's TrainerRun (the stages launch them; the preflight shows them).
PLAIN_CHANGES = {"replacements": ()}
CONTROL_CHANGES = {"use_checkpoint": False, "steps": 1}

# torchtitan's metric names -> the names in the stage's per-step table.
STEP_METRICS = {
    "loss": "loss_metrics/global_avg_loss",
    "grad_norm": "grad_norm",
    "tokens_per_s": "throughput(tps)",
    "tflops": "tflops",
    "mfu_pct": "mfu(%)",
    "peak_memory_gib": "memory/max_active(GiB)",
    "step_time_s": "time_metrics/end_to_end(s)",
    "data_wait_pct": "time_metrics/data_loading(%)",
}


def trainer_run(
    *, stage: str, backend: Backend, checkpoint: Path, corpus_dir: Path, dataset: str, training: dict[str, Any],
    peak_flops_per_rank: float, parity_path: Path, replacements: list[dict[str, str]] = (),
) -> TrainerRun:
    """The run a stage asks its ranks for, from its part of config `training` (config.stage_training); a recipe's
    own settings (the reduced MoE's spec, a control's random init) are laid over it with TrainerRun.replace."""
    return TrainerRun(
        stage=stage,
        backend=backend.name,
        checkpoint=str(checkpoint.resolve()),
        dataset=dataset,
        dataset_path=str(corpus_dir.resolve()),
        steps=training["steps"],
        seq_len=training["seq_len"],
        local_batch_size=training["local_batch_size"],
        global_batch_size=training["global_batch_size"],
        seed=training["seed"],
        lr=training["lr"],
        warmup_steps=training["warmup_steps"],
        mixed_precision_param=training["mixed_precision_param"],
        export_dtype=training["export_dtype"],
        native_flavor=training.get("native_flavor"),  # the native recipe's only (config.stage_training)
        attention=training["attention"],
        comm_init_timeout_s=training["comm_init_timeout_s"],
        comm_train_timeout_s=training["comm_train_timeout_s"],
        # Only the fields: the ranks refuse any other difference; the reasons are the judge's (rule judge).
        accepted_differences=tuple(sorted(training["accepted_differences"].get(stage, []))),
        peak_flops_per_rank=peak_flops_per_rank,
        parity_path=str(parity_path.resolve()),
        replacements=tuple(replacements),  # config kernels.<stage>
    )


def control_run(run: TrainerRun, repeat_steps: int = 0) -> TrainerRun:
    """The random-init control of `run`: the same recipe and first batch, no checkpoint loaded, one step, or
    `repeat_steps` where it is launched twice (config training.repeat)."""
    return run.replace(**control_changes(repeat_steps))


def control_changes(repeat_steps: int = 0) -> dict[str, Any]:
    """What the control changes in its stage's TrainerRun (CONTROL_CHANGES, with the repeated steps)."""
    return {**CONTROL_CHANGES, "steps": repeat_steps or CONTROL_CHANGES["steps"]}


def repeat_figures(first: list[dict[str, Any]], second: list[dict[str, Any]]) -> dict[str, Any]:
    """Two launches of the same run, step by step: their losses and the largest difference between them (0.0 and
    bit_identical when every loss is the same float; the metrics lines hold each loss exactly, as JSON repr)."""
    pairs = [(a["loss"], b["loss"]) for a, b in zip(first, second, strict=True)]
    return {"steps": len(pairs), "first_losses": [a for a, _ in pairs], "second_losses": [b for _, b in pairs],
            "max_abs_loss_diff": max(abs(a - b) for a, b in pairs), "bit_identical": all(a == b for a, b in pairs)}


def clear_run_dir(run_dir: Path) -> None:
    """A run always starts from an empty folder. torchtitan skips initial_load_path when the folder's
    checkpoint/ holds a step (and resumes from it, or crashes on an HF export), so a leftover from an
    interrupted run would otherwise train from the wrong weights. Ranks orphaned by a killed launcher
    are stopped first, so they cannot write into the new run."""
    stop_orphans(run_dir)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)


def trainer_launch(
    backend: Backend, nproc: int, config_function: str, recipe_path: Path, run_dir: Path,
    python: str = sys.executable, rank_log_dir: Path | None = None, extra_env: dict[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The torchrun command of one trainer launch and the environment it adds (the preflight prints these). Every
    setting is in the TrainerRun at `recipe_path`; the command names only the recipe function and the folder."""
    command = backend.torchrun_command(
        python, nproc, "qwen3_pilot.titan.in_ranks.train_entry",
        ["--module", "qwen3_pilot.titan.in_ranks.recipes", "--config", config_function, "--dump_folder", str(run_dir)],
        rank_log_dir=rank_log_dir,
    )
    return command, {**backend.launcher_env, **(extra_env or {}), RECIPE_ENV: str(recipe_path.resolve())}


def launch(
    backend: Backend, *, nproc: int, config_function: str, recipe_path: Path, run_dir: Path,
    log_path: Path, python: str = sys.executable, extra_env: dict[str, str] | None = None,
    launch_name: str | None = None,
) -> Launch:
    """One trainer launch into an empty `run_dir`, recorded there (launch.json); its ranks' logs go to
    logs/<stage>/ranks/<launch_name> (default: the run folder's name)."""
    clear_run_dir(run_dir)
    rank_logs = backend.rank_log_dir(log_path, launch_name or run_dir.name)
    command, added_env = trainer_launch(
        backend, nproc, config_function, recipe_path, run_dir, python, rank_log_dir=rank_logs, extra_env=extra_env,
    )
    result = run_torchrun(command, added_env, log_path=log_path, pid_dir=run_dir, rank_log_dir=rank_logs)
    write_json(run_dir / LAUNCH_RECORD, {"command": command, "env": added_env, "returncode": result.returncode,
                                         "wall_s": result.wall_s, "started_at": result.started_at})
    return result


def relaunch(
    workdir: Path, stage: str, name: str, scratch: Path, *, recipe_changes: dict[str, Any] | None = None,
    added_env: dict[str, str] | None = None, ranks_per_node: int | None = None,
    base_env: Mapping[str, str] | None = None, launcher: Callable[..., Launch] = run_torchrun,
) -> Launch:
    """A trainer launch a stage recorded (results/<stage>/<name>/launch.json) run again by hand with the stages'
    own launcher, its dump folder, rank logs, recipe and parity table moved to `scratch` so that the stage's
    outputs stay as Snakemake wrote them: `recipe_changes` over the recorded TrainerRun (e.g. {"steps": 1}),
    `added_env` over the recorded environment, `ranks_per_node` over torchrun's --nproc-per-node (a failure that
    every rank meets on its own, such as a missing tensor, shows on one rank at half the start-up cost). On
    fewer ranks torchtitan accumulates gradients to the same global batch size, but the data loader hands out
    other samples: a loss is then not comparable with the recorded run's (measured: 5.832 on one rank against
    5.804 recorded on two, at step 1)."""
    scratch = Path(scratch).resolve()  # the ranks run in `workdir`
    record = json.loads(RunFolder(workdir).launch_record(stage, name).read_text())
    run = TrainerRun.read(Path(record["env"][RECIPE_ENV]))
    # Every file the ranks write outside the dump folder, moved too: the stage's own stay as it recorded them.
    moved = {key: str(scratch / Path(getattr(run, key)).name) for key in TrainerRun.RANK_OUTPUTS if getattr(run, key)}
    run = run.replace(**moved, **(recipe_changes or {}))
    scratch.mkdir(parents=True, exist_ok=True)
    recipe_path = scratch / "recipe.json"
    run.write(recipe_path)
    command = list(record["command"])
    command[command.index("--dump_folder") + 1] = str(scratch / name)
    # torchrun's --log-dir (every backend sets one), moved too: its error files name a failing rank.
    rank_logs = scratch / "ranks" if any(arg.startswith("--log-dir=") for arg in command) else None
    command = [f"--log-dir={rank_logs}" if arg.startswith("--log-dir=") else arg for arg in command]
    if ranks_per_node is not None:
        command = [f"--nproc-per-node={ranks_per_node}" if arg.startswith("--nproc-per-node=") else arg
                   for arg in command]
    env = {**record["env"], **(added_env or {}), RECIPE_ENV: str(recipe_path)}
    # The recorded command's paths are relative to the workflow's folder: torchrun runs there (this process's own
    # folder is left alone, as its environment is where `base_env` is given).
    # `launcher`: run_torchrun, or a test's own (handed in: the suite relaunches in other threads meanwhile).
    return launcher(command, env, log_path=scratch / f"{name}.log", pid_dir=scratch / name,
                    rank_log_dir=rank_logs, cwd=workdir, base_env=base_env)


def launch_failure(what: str, launch_result: Launch, parity_path: Path) -> TrainingError:
    """Why a trainer launch failed: the model's differences from config.json when the recipe found any
    (they are the cause, whatever the ranks raised after), else the first rank error."""
    problems = json.loads(parity_path.read_text())["problems"] if parity_path.exists() else []
    if problems:
        cause = problem_list(f"{how_it_ended(launch_result)}: the model differs from the checkpoint's config.json",
                             problems)
    else:
        cause = failure_cause(launch_result)
    return TrainingError(f"{what}: {cause} (full output: {launch_result.log_path})")


# torchtitan's validator logs through the same loggers as the training steps, one line per validation with this
# metric (MetricsProcessor.log_validation), under the step it followed.
VALIDATION_LOSS = "validation_metrics/loss"


def read_steps(metrics_path: Path) -> list[dict[str, Any]]:
    """torchtitan's per-step metrics (rank 0's JSON lines) as the stage's per-step table; validation lines are
    read_validation's."""
    if not metrics_path.exists():
        return []
    steps = []
    for line in metrics_path.read_text().splitlines():
        record = json.loads(line)
        if VALIDATION_LOSS in record:
            continue
        steps.append({"step": int(record["step"]),
                      **{name: _number(record.get(key)) for name, key in STEP_METRICS.items()}})
    return steps


def read_validation(metrics_path: Path) -> list[dict[str, Any]]:
    """The held-out losses torchtitan's validator logged, by the training step they followed."""
    if not metrics_path.exists():
        return []
    records = (json.loads(line) for line in metrics_path.read_text().splitlines())
    return [{"step": int(record["step"]), "loss": _number(record[VALIDATION_LOSS])}
            for record in records if VALIDATION_LOSS in record]


def _number(value: Any) -> float | None:
    if value is None:
        return None
    return float(value)  # "nan" / "inf" strings from titan_metrics become float('nan') / float('inf')


def check_steps(steps: list[dict[str, Any]], expected_steps: int, source: Path) -> None:
    for step in steps:
        if step["loss"] is None or not math.isfinite(step["loss"]):
            raise TrainingError(f"{source}: loss is {step['loss']} at step {step['step']}")
    seen = [s["step"] for s in steps]
    if seen != list(range(1, expected_steps + 1)):
        raise TrainingError(f"{source}: logged steps {seen}, expected 1..{expected_steps}")


def recorded_export_dir(record_path: Path) -> Path:
    """The export folder a training stage recorded (stages/train.py), read from its measured.json or summary.json."""
    return Path(json.loads(Path(record_path).read_text())["figures"]["export_dir"])


def export_files(stage: str, run_dir: Path, steps: int) -> list[Path]:
    """The files of the Hugging Face export torchtitan wrote at the last step; a run that exported no safetensors
    fails here, naming the folder."""
    files = sorted(p for p in export_dir(run_dir, steps).glob("*") if p.is_file())
    if not any(p.suffix == ".safetensors" for p in files):
        raise TrainingError(f"{stage}: no safetensors export in {export_dir(run_dir, steps)}")
    return files


def usable_backend(stage: str, backend_config: dict[str, Any], cache_root: str) -> Backend:
    """The backend a torchrun stage launches on; refused before any work when it cannot run here."""
    from .backends import make_backend

    backend = make_backend(backend_config, str(Path(cache_root).resolve()))
    if backend.unavailable_reason:
        raise TrainingError(f"{stage}: the {backend.name} backend cannot run here: {backend.unavailable_reason}")
    return backend


def ranks_peak_flops(ranks_record: Path) -> float:
    """MFU's denominator, as verify_ranks recorded it."""
    return json.loads(ranks_record.read_text())["figures"]["live"]["peak_flops_per_rank"]


def launch_and_read(
    what: str, backend: Backend, trainer: TrainerRun, *, config_function: str, recipe_path: Path, run_dir: Path,
    log_path: Path, extra_env: dict[str, str] | None = None, launch_name: str | None = None, nproc: int | None = None,
) -> tuple[Launch, list[dict[str, Any]]]:
    """`trainer` written to `recipe_path` and launched on every rank of a node (or `nproc` of them), failed with its
    reason, its per-step metrics checked against its steps. An earlier launch's parity table is removed first, so
    that a failure's reason comes from this launch's own (each launch of a recipe built from the checkpoint's
    config.json writes it again)."""
    Path(trainer.parity_path).unlink(missing_ok=True)
    trainer.write(recipe_path)
    result = launch(
        backend, nproc=nproc or backend.ranks_per_node, config_function=config_function, recipe_path=recipe_path,
        run_dir=run_dir, log_path=log_path, extra_env=extra_env, launch_name=launch_name,
    )
    if result.returncode != 0:
        raise launch_failure(what, result, Path(trainer.parity_path))
    steps = read_steps(run_dir / METRICS_FILE)
    check_steps(steps, trainer.steps, run_dir / METRICS_FILE)
    return result, steps


# ---- kernel replacements in training: the launch log's lines, and the same run without them ----

def replacement_check(stage: str, run: Launch, rules: list[dict[str, str]], n_layers: int) -> dict[str, Any]:
    """Exactly one replacement line per targeted layer for each configured kernel in this launch's own
    output (the lines the replaced modules print as the trainer builds them)."""
    from .titan.kernels import parse_replacement_lines, replacement_log_problems

    lines = parse_replacement_lines(run.output())
    problems = replacement_log_problems(lines, rules, n_layers)
    if problems:
        raise TrainingError(problem_list(f"{stage}: kernel replacements in the launch log ({run.log_path})", problems))
    per_kernel: dict[str, dict[str, Any]] = {}
    for line in lines:
        entry = per_kernel.setdefault(line["kernel"], {"replaced": 0, "implementation": line["impl"], "modules": []})
        entry["replaced"] += 1
        entry["modules"].append(line["path"])
    return {
        "rules": rules,
        "layers": n_layers,
        "per_kernel": per_kernel,
        "log_lines": [f"{line['kernel']} {line['path']} {line['source']} -> {line['target']} [{line['impl']}]"
                      for line in lines],
    }


def replaced_and_plain(
    stage: str, backend: Backend, trainer: TrainerRun, *, config_function: str, recipe_path: Path, run: Launch,
    steps: list[dict[str, Any]], plain_dir: Path, log_path: Path, n_layers: int,
) -> dict[str, Any] | None:
    """With replacements configured: the launch log's count, then the same recipe without them (same seed,
    weights and batches: `trainer` without its replacements), its per-step metrics as `plain_steps` for the judge
    (replaced_against_plain). None
    without replacements (the plain folder stays empty)."""
    plain_recipe = recipe_path.with_name(PLAIN_RECIPE)
    if not trainer.replacements:
        # Nothing of an earlier run with replacements may outlive it.
        plain_recipe.unlink(missing_ok=True)
        clear_run_dir(plain_dir)
        return None
    figures = replacement_check(stage, run, list(trainer.replacements), n_layers)
    plain_run, plain_steps = launch_and_read(
        f"{stage} (plain, no kernel replacements)", backend, trainer.replace(**PLAIN_CHANGES),
        config_function=config_function, recipe_path=plain_recipe, run_dir=plain_dir, log_path=log_path,
    )
    return {**figures, "plain_steps": plain_steps, "plain_launch_wall_s": round(plain_run.wall_s, 2)}


