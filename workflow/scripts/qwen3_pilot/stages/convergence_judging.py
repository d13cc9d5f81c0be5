"""Rule judge for convergence: the held-out loss's fall and the curves' spikes, held to convergence.min_fall and
convergence.max_spike_ratio. Apart from what the stage measures with (stages/convergence.py, training.py), which
never imports it: a threshold edit re-judges and trains nothing (parse_time/code.py)."""

from __future__ import annotations

import math
from typing import Any

from ..problems import problem_list


class ConvergenceError(RuntimeError):
    pass


def worst_spike(points: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The largest ratio of a loss to the lowest loss before it, with its step; None with fewer than two points."""
    worst, lowest = None, None
    for point in points:
        if lowest is not None and lowest > 0:
            ratio = point["loss"] / lowest
            if worst is None or ratio > worst["ratio"]:
                worst = {"step": point["step"], "loss": point["loss"], "lowest_before": lowest, "ratio": ratio}
        lowest = point["loss"] if lowest is None else min(lowest, point["loss"])
    return worst


def convergence_problems(figures: dict[str, Any], judging: dict[str, Any]) -> list[str]:
    """Every loss finite, the held-out loss down by at least min_fall from its first value (after step 1) to its
    last, and no loss above max_spike_ratio times the lowest before it on either curve. The judged figures are
    recorded into `figures`."""
    train, heldout = figures["train_loss"], figures["heldout_loss"]
    problems = [f"{name} loss after step {point['step']} is {point['loss']}" for name, points in
                (("training", train), ("held-out", heldout)) for point in points
                if point["loss"] is None or not math.isfinite(point["loss"])]
    if problems:
        return problems
    first, last = heldout[0], heldout[-1]
    figures["heldout_fall"] = {"first": first, "last": last, "fall": first["loss"] - last["loss"],
                               "min_fall": judging["min_fall"]}
    if not first["loss"] - last["loss"] >= judging["min_fall"]:
        problems.append(f"the held-out loss went from {first['loss']:.4f} (after step {first['step']}) to "
                        f"{last['loss']:.4f} (after step {last['step']}): a fall of {first['loss'] - last['loss']:.4f} "
                        f"nats, below convergence.min_fall = {judging['min_fall']}")
    figures["spikes"] = {"max_spike_ratio": judging["max_spike_ratio"]}
    for name, points in (("training", train), ("held-out", heldout)):
        spike = figures["spikes"][name] = worst_spike(points)
        if spike and spike["ratio"] > judging["max_spike_ratio"]:
            problems.append(f"the {name} loss after step {spike['step']} ({spike['loss']:.4f}) is {spike['ratio']:.2f} "
                            f"times the lowest before it ({spike['lowest_before']:.4f}); convergence.max_spike_ratio = "
                            f"{judging['max_spike_ratio']}")
    return problems


def judge_convergence(stage: str, figures: dict[str, Any], judging: dict[str, Any], backend: str) -> dict[str, str]:
    """Rule judge for convergence: fails naming each problem (convergence_problems); returns proves and
    does_not_prove."""
    problems = convergence_problems(figures, judging)
    if problems:
        raise ConvergenceError(problem_list("convergence failed", problems))
    fall, heldout = figures["heldout_fall"], figures["heldout_loss"]
    return {
        "proves": (
            f"The native recipe trained {figures['steps_trained']} steps from the fetched weights on the training "
            f"corpus ({figures['tokens_trained']:,} tokens), every loss finite, and its loss on the held-out split, "
            f"which no training run read, fell from {fall['first']['loss']:.4f} after step {fall['first']['step']} "
            f"to {fall['last']['loss']:.4f} after step {fall['last']['step']} ({len(heldout)} evaluations of "
            f"{figures['eval_batches']} batches), at least convergence.min_fall = {fall['min_fall']}; neither curve "
            f"rose above {figures['spikes']['max_spike_ratio']} times its lowest value before."
        ),
        "does_not_prove": (
            "That the full run converges: this is the start of the curve, with the run's learning-rate schedule "
            "compressed into these steps. The held-out split is documents of the same corpus, so a fall shows "
            "learning that carries to unseen documents of it, not to another distribution; each evaluation reads "
            f"{figures['eval_batches']} batches, a sample of the split, and the first comes after one update, not "
            "before any."
            + (" These were tiny models on CPU ranks, on the corpus the fixture was pretrained on (less the "
               "held-out documents), not Qwen3-4B on the team's data." if backend == "cpu" else "")
        ),
    }
