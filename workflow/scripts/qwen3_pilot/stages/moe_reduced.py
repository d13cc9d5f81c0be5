"""Stage moe_reduced, measuring: the reduced Qwen3 MoE trained with its kernels replaced, its router load, and the
same run without the replacements; measured.json, which rule judge holds to kernels.loss_tolerance
(stages/judge.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..problems import problem_list
from ..recipe_registry import recipe_of
from ..reduced_moe import STAGE, model_spec, reduced_moe_changes, router_load
from ..stage_progress import record_measured
from ..titan.parity import read_checkpoint_values
from ..trainer_run import METRICS_FILE, PARITY_FILE, ROUTER_LOAD_FILE, TrainingError
from ..training import (
    PLAIN_RECIPE,
    launch_and_read,
    ranks_peak_flops,
    replaced_and_plain,
    trainer_run,
    usable_backend,
)


def run(
    *, backend_config: dict[str, Any], dataset: str, training: dict[str, Any], moe: dict[str, Any],
    kernels: dict[str, Any], cache_root: str, checkpoint_dir: Path, corpus_dir: Path, ranks_record: Path,
    recipe_path: Path, run_dir: Path, plain_dir: Path, measured_path: Path, log_path: Path,
) -> dict[str, Any]:
    from ..summary import StageMeasurement
    from ..titan.models import count_parameters, reduced_moe_model

    backend = usable_backend(STAGE, backend_config, cache_root)
    # The tokenizer comes with the fetched checkpoint, so the vocabulary does too.
    vocab_size = read_checkpoint_values(checkpoint_dir)["vocab_size"]
    trained_spec = model_spec(moe, moe["width"], vocab_size, training["seq_len"])
    full = moe["full_width"]
    # The reduced spec (moe.layers, moe.experts) at Qwen3-30B-A3B's widths; full_width's own layer and
    # expert counts are the published model's, for the prose.
    widths = {k: v for k, v in full.items() if k not in ("vocab_size", "expected_params", "layers", "experts")}
    full_spec = model_spec(moe, widths, full["vocab_size"], training["seq_len"])
    full_params = count_parameters(reduced_moe_model(full_spec))  # on the meta device: nothing allocated
    if full_params != full["expected_params"]:
        raise TrainingError(f"{STAGE}: the full-width reduced spec has {full_params:,} parameters; "
                            f"moe.full_width.expected_params = {full['expected_params']:,}")
    trained_params = count_parameters(reduced_moe_model(trained_spec))
    trainer = trainer_run(
        stage=STAGE, backend=backend, checkpoint=checkpoint_dir, corpus_dir=corpus_dir, dataset=dataset,
        training=training, peak_flops_per_rank=ranks_peak_flops(ranks_record),
        # Unused by this recipe (no checkpoint to match); launch_failure looks for it.
        parity_path=recipe_path.with_name(PARITY_FILE), replacements=kernels["rules"],
    ).replace(**reduced_moe_changes(trained_spec, run_dir / ROUTER_LOAD_FILE))
    run, steps = launch_and_read(
        STAGE, backend, trainer, config_function=recipe_of(STAGE).config_function, recipe_path=recipe_path,
        run_dir=run_dir, log_path=log_path,
    )
    load, problems = router_load(run_dir / ROUTER_LOAD_FILE, training["global_batch_size"] * training["seq_len"],
                                 moe["top_k"])
    record_measured(steps=steps, router_load=load)
    if problems:
        raise TrainingError(problem_list(f"{STAGE}: router load", problems))
    # The plain run records its router load elsewhere: it must not add to this run's.
    replacements = replaced_and_plain(
        STAGE, backend, trainer.replace(router_load_path=str((plain_dir / ROUTER_LOAD_FILE).resolve())),
        config_function=recipe_of(STAGE).config_function, recipe_path=recipe_path, run=run, steps=steps,
        plain_dir=plain_dir, log_path=log_path, n_layers=moe["layers"],
    )
    full_width_trained = trained_params == full_params
    measurement = StageMeasurement(
        stage=STAGE,
        backend=backend.name,
        figures={
            "model": trained_spec,
            "published_model": {"layers": full["layers"], "experts": full["experts"]},
            "parameters": trained_params,
            "full_width_parameters": full_params,
            "full_width_trained": full_width_trained,
            "ranks": backend.expected_ranks,
            "dist_backend": backend.dist_backend,
            "parallelism": "FSDP over all ranks, tensor parallel 1, no expert parallelism, SDPA attention, eager",
            "steps_trained": len(steps),
            "first_loss": steps[0]["loss"],
            "final_loss": steps[-1]["loss"],
            "peak_memory_gib": max(s["peak_memory_gib"] for s in steps),
            "launch_wall_s": round(run.wall_s, 2),
            "router_load": load,
            "steps": steps,
            "kernel_replacements": replacements or f"none configured (kernels.{STAGE})",
        },
        notes=[
            "REDUCED MODEL: Qwen3-30B-A3B's architecture cut to "
            f"{moe['layers']} layers and {moe['experts']} experts (top-{moe['top_k']})"
            + ("" if full_width_trained else ", at tiny widths on this backend")
            + ", trained from random init. This is not a Qwen3-30B-A3B training result."
        ],
    )
    plain = [recipe_path.with_name(PLAIN_RECIPE), plain_dir / METRICS_FILE] if replacements else []
    measurement.add_artifacts([recipe_path, run_dir / METRICS_FILE, run_dir / ROUTER_LOAD_FILE, *plain])
    return measurement.write(measured_path)
