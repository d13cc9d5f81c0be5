"""Stages train_hf and train_native: one recipe trained from the fetched weights, a random-init control on the
same batch, the loaded-weights gate and, with kernel replacements, the same run without them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..config import recipe_key
from ..launch import Launch
from ..parity import read_checkpoint_values
from ..summary import record_measured
from ..training import (
    CONFIG_FUNCTIONS,
    CONTROL_OVERRIDES,
    METRICS_FILE,
    PLAIN_RECIPE,
    TrainingError,
    export_dir,
    export_files,
    launch_and_read,
    loaded_weights_gate,
    ranks_peak_flops,
    replaced_against_plain,
    replacement_proves,
    usable_backend,
    write_recipe,
)


def run(
    *, stage: str, backend_config: dict[str, Any], dataset: str, training: dict[str, Any], kernels: dict[str, Any],
    cache_root: str, checkpoint_dir: Path, corpus_dir: Path, ranks_summary: Path, recipe_path: Path, run_dir: Path,
    control_dir: Path, plain_dir: Path, summary_path: Path, log_path: Path,
) -> dict[str, Any]:
    from ..summary import StageSummary

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
    gate_config = {**training["gate"],
                   "control_above_ln_vocab": training["gate"]["control_above_ln_vocab"][recipe_key(stage)]}
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
            f"That training improves the model: {len(loaded)} steps on a small corpus say nothing about convergence, "
            "and a loss falling over them can be memorisation of a few batches. MFU is against "
            + ("a measured CPU matmul peak, not an accelerator's peak; " if backend.name == "cpu"
               else "the published peak; ")
            + "throughput here predicts nothing about another backend."
            + (" These were tiny models on CPU ranks, not Qwen3-4B on a trn2." if backend.name == "cpu" else "")
        ),
    )
    plain = [recipe_path.with_name(PLAIN_RECIPE), plain_dir / METRICS_FILE] if replacements else []
    summary.add_artifacts([recipe_path, parity_path, run_dir / METRICS_FILE, control_dir / METRICS_FILE, *plain,
                           *exported])
    return summary.write(summary_path)


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None
