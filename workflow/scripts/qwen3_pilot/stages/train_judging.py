"""Rule judge for the training stages (train_hf, train_native): the loaded-weights gate, the repeated control's
losses, the parity table's reasons, and the kernel replacements' losses against the plain run (moe_reduced's judge
too), held to their configured thresholds.
Apart from what the stages measure with (training.py), which never imports it: an edit here re-judges the
recorded figures and trains nothing (parse_time/code.py)."""

from __future__ import annotations

import math
from typing import Any

from ..problems import problem_list
from ..stage_progress import record_measured
from ..titan.parity import with_reasons
from ..trainer_run import TrainingError


def loaded_weights_gate(
    loaded: float, control: float, vocab_size: int, gate: dict[str, float]
) -> tuple[dict[str, Any], list[str]]:
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


def loss_agreement(
    replaced: list[dict[str, Any]], plain: list[dict[str, Any]], tolerance: float
) -> tuple[dict[str, Any], list[str]]:
    """Per-step losses of the run with the kernel replacements against the same run without them."""
    rows = [
        {"step": r["step"], "loss_replaced": r["loss"], "loss_plain": p["loss"], "abs_diff": abs(r["loss"] - p["loss"])}
        for r, p in zip(replaced, plain, strict=False)
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
            f"(first past the tolerance at step {worst['step'] if worst else '?'}); "
            f"kernels.loss_tolerance = {tolerance}"
        )
    return figures, problems


def replaced_against_plain(stage: str, steps: list[dict[str, Any]], measured: dict[str, Any] | str,
                           tolerance: float | None) -> dict[str, Any] | str:
    """The judge's half: the measured replacements (replaced_and_plain, or the sentence saying none were
    configured) with the replaced run's losses held to `tolerance` step by step against the plain run's."""
    if isinstance(measured, str):
        return measured
    replacements = {key: value for key, value in measured.items() if key != "plain_steps"}
    agreement, problems = loss_agreement(steps, measured["plain_steps"], tolerance)
    record_measured(kernel_replacements={**replacements, "against_plain": agreement})
    if problems:
        raise TrainingError(problem_list(f"{stage}: replaced against plain", problems))
    return {**replacements, "against_plain": agreement}


def replacement_proves(replacements: dict[str, Any] | str) -> str:
    if isinstance(replacements, str):
        return ""
    kernels = ", ".join(f"{kernel} in {entry['replaced']} layers ({entry['implementation']})"
                        for kernel, entry in replacements["per_kernel"].items())
    agreement = replacements["against_plain"]
    return (f" The trainer built the model with its kernel replacements, one per targeted layer as the launch log "
            f"shows: {kernels}; its per-step losses match the same run without them within "
            f"{agreement['tolerance']} (largest difference {agreement['max_abs_loss_diff']:.3g}).")


def judge_recipe(stage: str, figures: dict[str, Any], judging: dict[str, Any], backend: str) -> dict[str, str]:
    """train_hf and train_native: the loaded-weights gate, the parity table's reasons, and the kernel replacements
    against the plain run. Fills `figures` with the judged figures; returns proves and does_not_prove."""
    loaded, control = figures["steps"], figures["control_steps"]
    gate, problems = loaded_weights_gate(loaded[0]["loss"], control[0]["loss"], figures["vocab_size"],
                                         judging["gate"])
    figures["gate"] = gate
    if problems:
        raise TrainingError(problem_list(f"{stage}: loaded-weights gate failed", problems))
    repeat = figures.get("repeat")  # absent from a record measured before training.repeat
    if isinstance(repeat, dict):
        problems = repeat_problems(repeat, judging["repeat_loss_tolerance"])
        if problems:
            raise TrainingError(problem_list(f"{stage}: the same launch did not repeat", problems))
    figures["parity"] = with_reasons(figures["parity"], judging["accepted_differences"])
    replacements = figures["kernel_replacements"] = replaced_against_plain(
        stage, loaded, figures["kernel_replacements"], judging.get("loss_tolerance"))
    cpu = backend == "cpu"
    return {
        "proves": (
            f"torchtitan's trainer ran {len(loaded)} steps of this recipe with FSDP over {figures['ranks']} "
            f"{figures['dist_backend']} ranks from the fetched weights, every loss finite, and wrote a Hugging Face "
            f"safetensors export. Its step-1 loss ({gate['step1_loss_loaded']:.4f}) is {gate['gap']:.2f} nats below "
            f"a random-init control on the same batch ({gate['step1_loss_random_init']:.4f}; ln vocab "
            f"{gate['ln_vocab']:.2f}): the weights loaded. The model matches config.json on every parity field "
            "(or on an accepted difference, listed with its reason)."
            + replacement_proves(replacements) + repeat_proves(repeat)
        ),
        "does_not_prove": (
            f"That training improves the model: {len(loaded)} steps on a small corpus say nothing about convergence, "
            "and a loss falling over them can be memorisation of a few batches. MFU is against "
            + ("a measured CPU matmul peak, not an accelerator's peak; " if cpu else "the published peak; ")
            + "throughput here predicts nothing about another backend."
            + (" These were tiny models on CPU ranks, not Qwen3-4B on a trn2." if cpu else "")
            + (" The repeat is of the random-init control, two launches on the same machine and ranks: it says "
               "nothing of runs elsewhere, at another rank count, or of the checkpoint load."
               if isinstance(repeat, dict) else "")
        ),
    }


def repeat_problems(repeat: dict[str, Any], tolerance: float) -> list[str]:
    """The random-init control launched twice (stages/train.py): its per-step losses held to `tolerance`
    (training.repeat.loss_tolerance, recorded into `repeat`)."""
    repeat["tolerance"] = tolerance
    if repeat["max_abs_loss_diff"] <= tolerance:
        return []
    worst = next(step for step, (a, b) in enumerate(zip(repeat["first_losses"], repeat["second_losses"],
                                                        strict=True), 1) if abs(a - b) > tolerance)
    return [f"the random-init control launched twice with the same seed and batches gave losses up to "
            f"{repeat['max_abs_loss_diff']:.3g} apart over {repeat['steps']} steps (first past the tolerance at step "
            f"{worst}); training.repeat.loss_tolerance = {tolerance}"]


def repeat_proves(repeat: dict[str, Any] | str | None) -> str:
    if not isinstance(repeat, dict):
        return ""
    agreement = ("bit for bit" if repeat["bit_identical"] else
                 f"within {repeat['tolerance']} (largest difference {repeat['max_abs_loss_diff']:.3g})")
    return (f" The random-init control, launched a second time with the same seed and batches, logged the same "
            f"losses over {repeat['steps']} steps, {agreement}: one launch of this recipe repeats on this backend.")


