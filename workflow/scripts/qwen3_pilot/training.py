"""Stages `train_native` and `train_hf`: one recipe for N steps from the fetched weights, a random-init
control on the same first batch, and the gate that the weights loaded.

Torch-free: the training happens in torchrun's processes (qwen3_pilot.train_entry + recipes.py); this
module writes the recipe, launches, and judges what the run measured.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path
from typing import Any

from .artifacts import write_json
from .backends import Backend
from .launch import Launch, failure_cause, run_torchrun, stop_orphans
from .parity import read_checkpoint_values
from .summary import record_measured

CONFIG_FUNCTIONS = {"train_native": "qwen3_native", "train_hf": "qwen3_hf", "moe_reduced": "qwen3_moe_reduced"}
CONTROL_OVERRIDES = ("--checkpoint.no-enable", "--training.steps", "1")
RECIPE_ENV = "QWEN3_PILOT_RECIPE"  # recipes.py reads the recipe JSON named here
LAUNCH_RECORD = "launch.json"
METRICS_FILE = "metrics.jsonl"  # written by titan_metrics.JsonlLogger in the trainer processes

# torchtitan's metric names -> the names in the stage's per-step table.
STEP_METRICS = {
    "loss": "loss_metrics/global_avg_loss",
    "grad_norm": "grad_norm",
    "tokens_per_s": "throughput(tps)",
    "tflops": "tflops",
    "mfu_pct": "mfu(%)",
    "peak_memory_gib": "memory/max_active(GiB)",
    "step_time_s": "time_metrics/end_to_end(s)",
}


class TrainingError(RuntimeError):
    pass


def recipe_key(stage: str) -> str:
    """The recipe's name in per-recipe config keys: train_native -> native, train_hf -> hf."""
    return stage.removeprefix("train_")


def write_recipe(
    path: Path, *, stage: str, backend: Backend, checkpoint: Path, corpus_dir: Path, dataset: str,
    training: dict[str, Any], peak_flops_per_rank: float, parity_path: Path,
    replacements: list[dict[str, str]] = (), lnc: int | None = None, **extra: Any,
) -> dict[str, Any]:
    """The settings recipes.py reads in every trainer process (QWEN3_PILOT_RECIPE); `extra` holds a
    recipe's own keys."""
    recipe = {
        "stage": stage,
        "backend": backend.name,
        "checkpoint": str(checkpoint.resolve()),
        "dataset": dataset,
        "dataset_path": str(corpus_dir.resolve()),
        "steps": training["steps"],
        "seq_len": training["seq_len"],
        "local_batch_size": training["local_batch_size"],
        "global_batch_size": training["global_batch_size"],
        "seed": training["seed"],
        "lr": training["lr"],
        "warmup_steps": training["warmup_steps"],
        "mixed_precision_param": training["mixed_precision_param"],
        "export_dtype": training["export_dtype"],
        "native_flavor": training["native_flavor"],
        "attention": training["attention"],
        "accepted_differences": training["accepted_differences"].get(recipe_key(stage), {}),
        "peak_flops_per_rank": peak_flops_per_rank,
        "parity_path": str(parity_path.resolve()),
        # Kernel replacements (config kernels.<stage>) and the LNC whose kernel rules they enforce.
        "replacements": list(replacements),
        "lnc": lnc,
        **extra,
    }
    write_json(path, recipe)
    return recipe


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
    overrides: tuple[str, ...] = (), python: str = sys.executable, rank_log_dir: Path | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The torchrun command of one trainer launch and the environment it adds (the preflight prints these)."""
    command = backend.torchrun_command(
        python, nproc, "qwen3_pilot.train_entry",
        ["--module", "qwen3_pilot.recipes", "--config", config_function, "--dump_folder", str(run_dir), *overrides],
        rank_log_dir=rank_log_dir,
    )
    return command, {**backend.launcher_env, RECIPE_ENV: str(recipe_path.resolve())}


def launch(
    backend: Backend, *, nproc: int, config_function: str, recipe_path: Path, run_dir: Path,
    log_path: Path, overrides: tuple[str, ...] = (), python: str = sys.executable,
) -> Launch:
    """One trainer launch into an empty `run_dir`, recorded there (launch.json)."""
    clear_run_dir(run_dir)
    rank_logs = backend.rank_log_dir(log_path, run_dir.name)
    command, added_env = trainer_launch(
        backend, nproc, config_function, recipe_path, run_dir, overrides, python, rank_log_dir=rank_logs
    )
    result = run_torchrun(command, added_env, log_path=log_path, pid_dir=run_dir, rank_log_dir=rank_logs)
    write_json(run_dir / LAUNCH_RECORD, {"command": command, "env": added_env, "returncode": result.returncode,
                                         "wall_s": result.wall_s})
    return result


def launch_failure(what: str, launch_result: Launch, parity_path: Path) -> TrainingError:
    """Why a trainer launch failed: the model's differences from config.json when the recipe found any
    (they are the cause, whatever the ranks raised after), else the first rank error."""
    cause = failure_cause(launch_result)
    if parity_path.exists() and json.loads(parity_path.read_text())["problems"]:
        problems = json.loads(parity_path.read_text())["problems"]
        cause = cause.split(":", 1)[0] + ": the model differs from the checkpoint's config.json:\n  - " + "\n  - ".join(problems)
    return TrainingError(f"{what}: {cause} (full output: {launch_result.log_path})")


def read_steps(metrics_path: Path) -> list[dict[str, Any]]:
    """torchtitan's per-step metrics (rank 0's JSON lines) as the stage's per-step table."""
    if not metrics_path.exists():
        return []
    steps = []
    for line in metrics_path.read_text().splitlines():
        record = json.loads(line)
        steps.append({"step": int(record["step"]), **{name: _number(record.get(key)) for name, key in STEP_METRICS.items()}})
    return steps


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


def loaded_weights_gate(loaded: float, control: float, vocab_size: int, gate: dict[str, float]) -> tuple[dict[str, Any], list[str]]:
    """Step-1 loss with the fetched weights against the random-init control on the same batch."""
    ln_vocab = math.log(vocab_size)
    figures = {
        "step1_loss_loaded": loaded,
        "step1_loss_random_init": control,
        "gap": control - loaded,
        "ln_vocab": ln_vocab,
        "control_minus_ln_vocab": control - ln_vocab,
        "min_gap": gate["min_gap"],
        "control_band": [ln_vocab - gate["control_below_ln_vocab"], ln_vocab + gate["control_above_ln_vocab"]],
    }
    problems = []
    if not control - loaded >= gate["min_gap"]:
        problems.append(
            f"step-1 loss {loaded:.4f} with the fetched weights is not below the random-init control "
            f"{control:.4f} by training.gate.min_gap = {gate['min_gap']} (gap {control - loaded:.4f}): "
            "the weights did not load"
        )
    low, high = figures["control_band"]
    if not low <= control <= high:
        problems.append(
            f"random-init control step-1 loss {control:.4f} is outside [{low:.4f}, {high:.4f}] around "
            f"ln(vocab) = {ln_vocab:.4f}: the control is not an uninformed model"
        )
    return figures, problems


def export_dir(run_dir: Path, steps: int) -> Path:
    """Where torchtitan's last_save_in_hf writes the Hugging Face export of step `steps`."""
    return run_dir / "checkpoint" / f"step-{steps}"


def export_files(run_dir: Path, steps: int) -> list[Path]:
    return sorted(p for p in export_dir(run_dir, steps).glob("*") if p.is_file())


def usable_backend(stage: str, backend_config: dict[str, Any], cache_root: str) -> Backend:
    """The backend a torchrun stage launches on; refused before any work when it cannot run here."""
    from .backends import make_backend

    backend = make_backend(backend_config, str(Path(cache_root).resolve()))
    if backend.unavailable_reason:
        raise TrainingError(f"{stage}: the {backend.name} backend cannot run here: {backend.unavailable_reason}")
    return backend


def ranks_peak_flops(ranks_summary: Path) -> float:
    """MFU's denominator, as verify_ranks recorded it."""
    return json.loads(ranks_summary.read_text())["figures"]["live"]["peak_flops_per_rank"]


def launch_and_read(
    what: str, backend: Backend, *, config_function: str, recipe_path: Path, run_dir: Path, log_path: Path,
    parity_path: Path, expected_steps: int, overrides: tuple[str, ...] = (),
) -> tuple[Launch, list[dict[str, Any]]]:
    """One launch on every rank, failed with its reason, and its per-step metrics checked."""
    run = launch(
        backend, nproc=backend.expected_ranks, config_function=config_function, recipe_path=recipe_path,
        run_dir=run_dir, log_path=log_path, overrides=overrides,
    )
    if run.returncode != 0:
        raise launch_failure(what, run, parity_path)
    steps = read_steps(run_dir / METRICS_FILE)
    check_steps(steps, expected_steps, run_dir / METRICS_FILE)
    return run, steps


# ---- kernel replacements in training: the launch log's lines, and the same run without them ----

PLAIN_RECIPE = "recipe.plain.json"


def replacement_check(stage: str, run: Launch, rules: list[dict[str, str]], n_layers: int) -> dict[str, Any]:
    """Exactly one replacement line per targeted layer for each configured kernel in this launch's own
    output (the lines the replaced modules print as the trainer builds them)."""
    from .kernels import parse_replacement_lines, replacement_log_problems

    lines = parse_replacement_lines(run.output())
    problems = replacement_log_problems(lines, rules, n_layers)
    if problems:
        raise TrainingError(f"{stage}: kernel replacements in the launch log ({run.log_path}):\n  - "
                            + "\n  - ".join(problems))
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


def loss_agreement(replaced: list[dict[str, Any]], plain: list[dict[str, Any]], tolerance: float) -> tuple[dict[str, Any], list[str]]:
    """Per-step losses of the run with the kernel replacements against the same run without them."""
    rows = [
        {"step": r["step"], "loss_replaced": r["loss"], "loss_plain": p["loss"], "abs_diff": abs(r["loss"] - p["loss"])}
        for r, p in zip(replaced, plain)
    ]
    diffs = [row["abs_diff"] for row in rows]
    # max() skips a NaN that is not first (NaN compares false), so a NaN loss is made the largest on purpose.
    largest = math.nan if not diffs or any(math.isnan(d) for d in diffs) else max(diffs)
    figures = {"max_abs_loss_diff": largest, "tolerance": tolerance, "steps": rows}
    problems = []
    if len(replaced) != len(plain):
        problems.append(f"the replaced run logged {len(replaced)} steps, the plain run {len(plain)}")
    if not largest <= tolerance:  # NaN fails too
        worst = next((row for row in rows if not row["abs_diff"] <= tolerance), None)
        problems.append(
            f"losses with the kernel replacements differ from the plain run by up to {largest:.3g} "
            f"(first past the tolerance at step {worst['step'] if worst else '?'}); kernels.loss_tolerance = {tolerance}"
        )
    return figures, problems


def replaced_against_plain(
    stage: str, backend: Backend, *, config_function: str, recipe: dict[str, Any], recipe_path: Path, run: Launch,
    steps: list[dict[str, Any]], plain_dir: Path | None, log_path: Path, parity_path: Path, kernels: dict[str, Any],
    n_layers: int,
) -> dict[str, Any] | None:
    """With replacements configured: the launch log's count, then the same recipe without them (same seed,
    weights and batches), step by step. None without replacements (the plain folder stays empty)."""
    plain_recipe = recipe_path.with_name(PLAIN_RECIPE)
    if not kernels["rules"]:
        # Nothing of an earlier run with replacements may outlive it.
        plain_recipe.unlink(missing_ok=True)
        if plain_dir is not None:
            clear_run_dir(plain_dir)
        return None
    figures = replacement_check(stage, run, kernels["rules"], n_layers)
    write_json(plain_recipe, {**recipe, "replacements": []})
    plain_run, plain_steps = launch_and_read(
        f"{stage} (plain, no kernel replacements)", backend, config_function=config_function,
        recipe_path=plain_recipe, run_dir=plain_dir, log_path=log_path, parity_path=parity_path,
        expected_steps=len(steps),
    )
    agreement, problems = loss_agreement(steps, plain_steps, kernels["loss_tolerance"])
    record_measured(kernel_replacements={**figures, "against_plain": agreement})
    if problems:
        raise TrainingError(f"{stage}: replaced against plain:\n  - " + "\n  - ".join(problems))
    return {**figures, "against_plain": agreement, "plain_launch_wall_s": round(plain_run.wall_s, 2)}


def replacement_proves(replacements: dict[str, Any] | None) -> str:
    if not replacements:
        return ""
    kernels = ", ".join(f"{kernel} in {entry['replaced']} layers ({entry['implementation']})"
                        for kernel, entry in replacements["per_kernel"].items())
    agreement = replacements["against_plain"]
    return (f" The trainer built the model with its kernel replacements, one per targeted layer as the launch log "
            f"shows: {kernels}; its per-step losses match the same run without them within "
            f"{agreement['tolerance']} (largest difference {agreement['max_abs_loss_diff']:.3g}).")


def train_stage(
    *, stage: str, backend_config: dict[str, Any], dataset: str, training: dict[str, Any], kernels: dict[str, Any],
    cache_root: str, checkpoint_dir: Path, corpus_dir: Path, ranks_summary: Path, recipe_path: Path, run_dir: Path,
    control_dir: Path, plain_dir: Path | None, summary_path: Path, log_path: Path,
) -> dict[str, Any]:
    from .summary import StageSummary

    backend = usable_backend(stage, backend_config, cache_root)
    checkpoint = read_checkpoint_values(checkpoint_dir)  # config.json problems fail before any launch
    peak = ranks_peak_flops(ranks_summary)
    parity_path = recipe_path.with_name("parity.json")
    parity_path.unlink(missing_ok=True)
    recipe = write_recipe(
        recipe_path, stage=stage, backend=backend, checkpoint=checkpoint_dir, corpus_dir=corpus_dir,
        dataset=dataset, training=training, peak_flops_per_rank=peak, parity_path=parity_path,
        replacements=kernels["rules"], lnc=backend_config["neuron"]["lnc"],
    )
    runs: dict[str, Launch] = {}
    steps: dict[str, list[dict[str, Any]]] = {}
    for name, folder, overrides, expected in (
        ("fetched weights", run_dir, (), training["steps"]),
        ("random-init control", control_dir, CONTROL_OVERRIDES, 1),
    ):
        runs[name], steps[name] = launch_and_read(
            f"{stage} ({name})", backend, config_function=CONFIG_FUNCTIONS[stage], recipe_path=recipe_path,
            run_dir=folder, log_path=log_path, parity_path=parity_path, expected_steps=expected, overrides=overrides,
        )

    loaded, control = steps["fetched weights"], steps["random-init control"]
    gate_config = {**training["gate"], "control_above_ln_vocab": training["gate"]["control_above_ln_vocab"][recipe_key(stage)]}
    gate, problems = loaded_weights_gate(loaded[0]["loss"], control[0]["loss"], checkpoint["vocab_size"], gate_config)
    record_measured(gate=gate, steps=loaded, control_steps=control)
    if problems:
        raise TrainingError(f"{stage}: loaded-weights gate failed:\n  - " + "\n  - ".join(problems))
    exported = export_files(run_dir, training["steps"])
    if not any(p.suffix == ".safetensors" for p in exported):
        raise TrainingError(f"{stage}: no safetensors export in {export_dir(run_dir, training['steps'])}")
    parity = json.loads(parity_path.read_text())
    built_layers = next(row["built"] for row in parity["rows"] if row["field"] == "num_hidden_layers")
    replacements = replaced_against_plain(
        stage, backend, config_function=CONFIG_FUNCTIONS[stage], recipe=recipe, recipe_path=recipe_path,
        run=runs["fetched weights"], steps=loaded, plain_dir=plain_dir, log_path=log_path, parity_path=parity_path,
        kernels=kernels, n_layers=built_layers,
    )
    steady = [s for s in loaded if s["step"] > 1]
    summary = StageSummary(
        stage=stage,
        status="pass",
        backend=backend.name,
        figures={
            "steps_trained": len(loaded),
            "ranks": backend.expected_ranks,
            "gate": gate,
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
            "control_steps": control,
            "export_dir": export_dir(run_dir, training["steps"]).as_posix(),
            "kernel_replacements": replacements or "none configured (kernels." + stage + ")",
        },
        proves=(
            f"torchtitan's trainer ran {len(loaded)} steps of this recipe with FSDP over {backend.expected_ranks} "
            f"{backend.dist_backend} ranks from the fetched weights, every loss finite, and wrote a Hugging Face "
            f"safetensors export. Its step-1 loss ({gate['step1_loss_loaded']:.4f}) is {gate['gap']:.2f} nats below "
            f"a random-init control on the same batch ({gate['step1_loss_random_init']:.4f}; ln vocab "
            f"{gate['ln_vocab']:.2f}): the weights loaded. The model matches config.json on every parity field "
            "(or on an accepted difference, listed with its reason)."
            + replacement_proves(replacements)
        ),
        does_not_prove=(
            "That training improves the model: 10 steps on a small corpus say nothing about convergence, and a "
            "loss falling over them can be memorisation of a few batches. MFU is against "
            + ("a measured CPU matmul peak, not an accelerator's peak; " if backend.name == "cpu" else "the published peak; ")
            + "throughput here predicts nothing about another backend."
            + (" These were tiny models on CPU ranks, not Qwen3-4B on a trn2." if backend.name == "cpu" else "")
        ),
    )
    plain = [recipe_path.with_name(PLAIN_RECIPE), plain_dir / METRICS_FILE] if replacements else []
    summary.add_artifacts([recipe_path, parity_path, run_dir / METRICS_FILE, control_dir / METRICS_FILE, *plain, *exported])
    return summary.write(summary_path)


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def compare_recipes_stage(
    *, hf_summary: Path, native_summary: Path, tolerance: float, backend: str, summary_path: Path
) -> dict[str, Any]:
    from .summary import StageSummary

    hf = json.loads(hf_summary.read_text())["figures"]["gate"]
    native = json.loads(native_summary.read_text())["figures"]["gate"]
    difference = abs(hf["step1_loss_loaded"] - native["step1_loss_loaded"])
    figures = {
        "step1_loss_train_hf": hf["step1_loss_loaded"],
        "step1_loss_train_native": native["step1_loss_loaded"],
        "abs_difference": difference,
        "tolerance": tolerance,
        "random_init_train_hf": hf["step1_loss_random_init"],
        "random_init_train_native": native["step1_loss_random_init"],
    }
    if not difference <= tolerance:
        raise TrainingError(
            f"compare_recipes: step-1 losses differ by {difference:.6f} (train_hf {hf['step1_loss_loaded']:.6f}, "
            f"train_native {native['step1_loss_loaded']:.6f}); training.recipe_agreement_tolerance = {tolerance}"
        )
    summary = StageSummary(
        stage="compare_recipes",
        status="pass",
        backend=backend,
        figures=figures,
        proves=(
            f"On the same weights and first batch the Transformers-backend model and torchtitan's native Qwen3 "
            f"give the same step-1 loss within {tolerance} nats (difference {difference:.2e}): the native model, "
            "its weight conversion and its loss compute what the reference implementation computes."
        ),
        does_not_prove=(
            "That the recipes agree after the first optimizer step or in another dtype: they lay out parameters "
            "differently (fused QKV in the native model), so rounding differences can grow over steps. The "
            "random-init controls are expected to differ: each recipe has its own initialiser."
        ),
    )
    summary.add_artifacts([hf_summary, native_summary])
    return summary.write(summary_path)
