"""Rule judge for convergence: the held-out loss's fall and the spikes of both curves."""

from __future__ import annotations

import math

import pytest

from qwen3_pilot.stages.convergence_judging import ConvergenceError, judge_convergence, worst_spike

JUDGING = {"min_fall": 0.5, "max_spike_ratio": 1.5}


def curve(*pairs):
    return [{"step": step, "loss": loss} for step, loss in pairs]


def measured(train, heldout):
    return {"recipe": "train_native", "steps_trained": len(train), "eval_every": 10, "eval_batches": 4,
            "tokens_trained": 1024 * len(train), "train_loss": train, "heldout_loss": heldout}


TRAIN = curve((1, 6.0), (2, 5.8), (3, 5.5), (4, 5.6))


def test_a_held_out_fall_at_least_min_fall_passes_and_says_what_it_does_not_prove():
    figures = measured(TRAIN, curve((1, 6.0), (2, 5.7), (4, 5.5)))
    verdict = judge_convergence("convergence", figures, JUDGING, "cpu")
    assert figures["heldout_fall"]["fall"] == pytest.approx(0.5) and figures["heldout_fall"]["min_fall"] == 0.5
    assert "fell from 6.0000 after step 1 to 5.5000 after step 4" in verdict["proves"]
    assert "not before any" in verdict["does_not_prove"] and "tiny models on CPU" in verdict["does_not_prove"]


def test_too_small_a_fall_fails_naming_both_losses_and_the_key():
    with pytest.raises(ConvergenceError) as failed:
        judge_convergence("convergence", measured(TRAIN, curve((1, 6.0), (4, 5.9))), JUDGING, "cpu")
    assert ("from 6.0000 (after step 1) to 5.9000 (after step 4): a fall of 0.1000 nats, below "
            "convergence.min_fall = 0.5") in str(failed.value)


def test_a_training_loss_above_the_ratio_times_the_lowest_before_it_is_a_spike():
    spiky = curve((1, 6.0), (2, 4.0), (3, 6.1), (4, 3.9))
    assert worst_spike(spiky) == {"step": 3, "loss": 6.1, "lowest_before": 4.0, "ratio": pytest.approx(1.525)}
    with pytest.raises(ConvergenceError, match=r"the training loss after step 3 \(6.1000\) is 1.52 times the lowest "
                                               r"before it \(4.0000\); convergence.max_spike_ratio = 1.5"):
        judge_convergence("convergence", measured(spiky, curve((1, 6.0), (4, 5.0))), JUDGING, "neuron")


def test_a_non_finite_held_out_loss_fails_by_its_step():
    with pytest.raises(ConvergenceError, match="held-out loss after step 4 is nan"):
        judge_convergence("convergence", measured(TRAIN, curve((1, 6.0), (4, math.nan))), JUDGING, "cpu")


def test_a_spike_is_measured_against_the_lowest_loss_before_it_not_the_previous_one():
    # A slow climb: each step within 1.5x of the one before it, the last 1.525x the lowest before it.
    climb = curve((1, 6.0), (2, 4.0), (3, 4.5), (4, 5.2), (5, 6.1))
    assert worst_spike(climb)["lowest_before"] == 4.0 and worst_spike(climb)["step"] == 5
