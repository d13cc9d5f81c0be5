"""Stage convergence, measuring: the native recipe trained `convergence.steps` steps from the fetched weights on the
training corpus, with torchtitan's validator measuring the loss on the held-out split (fetch_corpus's, which no
training run reads) after step 1 and every `convergence.eval_every` steps; measured.json holds both curves and rule
judge holds them to the configured fall and spike ratio (stages/convergence_judging.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..recipe_registry import CONVERGENCE
from ..stage_progress import record_measured
from ..trainer_run import METRICS_FILE, PARITY_FILE, TrainingError
from ..training import (
    launch_and_read,
    ranks_peak_flops,
    read_validation,
    trainer_run,
    usable_backend,
)


def run(
    *, backend_config: dict[str, Any], dataset: str, training: dict[str, Any], convergence: dict[str, Any],
    kernels: dict[str, Any], cache_root: str, checkpoint_dir: Path, corpus_dir: Path, heldout_dir: Path,
    ranks_record: Path, recipe_path: Path, run_dir: Path, measured_path: Path, log_path: Path,
) -> dict[str, Any]:
    from ..summary import StageMeasurement

    backend = usable_backend("convergence", backend_config, cache_root)
    parity_path = recipe_path.with_name(PARITY_FILE)
    # The recipe's own run (its accepted differences, its kernel replacements), longer and validated.
    trainer = trainer_run(
        stage=CONVERGENCE.stage, backend=backend, checkpoint=checkpoint_dir, corpus_dir=corpus_dir, dataset=dataset,
        training={**training, "steps": convergence["steps"], "lr": convergence["lr"] or training["lr"]},
        peak_flops_per_rank=ranks_peak_flops(ranks_record),
        parity_path=parity_path, replacements=kernels["rules"],
    ).replace(validation_path=str(heldout_dir.resolve()), validation_every=convergence["eval_every"],
              validation_batches=convergence["eval_batches"])
    launched, steps = launch_and_read(
        f"convergence ({CONVERGENCE.stage}, {convergence['steps']} steps)", backend, trainer,
        config_function=CONVERGENCE.config_function, recipe_path=recipe_path, run_dir=run_dir,
        log_path=log_path,
    )
    heldout = read_validation(run_dir / METRICS_FILE)
    record_measured(steps=steps, heldout=heldout)
    expected = sorted({1, *range(convergence["eval_every"], convergence["steps"] + 1, convergence["eval_every"])})
    if [point["step"] for point in heldout] != expected:
        raise TrainingError(f"convergence: held-out losses logged after steps {[p['step'] for p in heldout]}, "
                            f"expected after {expected} (convergence.eval_every = {convergence['eval_every']})")
    # training.global_batch_size null: one local batch per rank (config/README.md).
    sequences = training["global_batch_size"] or training["local_batch_size"] * backend.expected_ranks
    measurement = StageMeasurement(
        stage="convergence",
        backend=backend.name,
        figures={
            "recipe": CONVERGENCE.stage,
            "steps_trained": len(steps),
            "eval_every": convergence["eval_every"],
            "eval_batches": convergence["eval_batches"],
            "tokens_trained": sequences * training["seq_len"] * len(steps),
            "launch_wall_s": round(launched.wall_s, 2),
            # Per step: the training loss on that step's batch; per evaluation: the mean loss over the held-out
            # batches, after the step it is logged with.
            "train_loss": [{"step": s["step"], "loss": s["loss"]} for s in steps],
            "heldout_loss": heldout,
        },
    )
    measurement.add_artifacts([recipe_path, parity_path, run_dir / METRICS_FILE])
    return measurement.write(measured_path)
