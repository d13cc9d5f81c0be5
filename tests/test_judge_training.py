"""Rule judge_training: a training stage's measured.json held to the configured thresholds, into its summary."""

from __future__ import annotations

import json
import math

import pytest

from qwen3_pilot.artifacts import write_recorded_json
from qwen3_pilot.stages.judge_training import run
from qwen3_pilot.summary import failure_path, write_failure
from qwen3_pilot.titan.parity import ParityError, with_reasons
from qwen3_pilot.training import TrainingError

VOCAB = 151936
GATE = {"min_gap": 1.0, "control_below_ln_vocab": 0.5, "control_above_ln_vocab": 1.5}
REASON = "set to training.seq_len by torchtitan's transformers backend"


def steps_of(*losses):
    return [{"step": i + 1, "loss": loss} for i, loss in enumerate(losses)]


def measured_recipe(tmp_path, *, loaded=5.0, control=12.0, plain=None):
    """A train_hf measurement as stages/train.py writes it: step losses, control, parity rows from the ranks
    (an accepted difference without its reason), and with `plain` the replaced run's plain twin."""
    replacements = "none configured (kernels.train_hf)"
    if plain is not None:
        replacements = {"rules": [{"kernel": "rope_hf"}], "layers": 2, "log_lines": [],
                        "per_kernel": {"rope_hf": {"replaced": 2, "implementation": "PyTorch", "modules": []}},
                        "plain_steps": steps_of(*plain), "plain_launch_wall_s": 1.0}
    figures = {
        "steps": steps_of(loaded, loaded - 0.1), "control_steps": steps_of(control), "vocab_size": VOCAB,
        "ranks": 2, "dist_backend": "gloo", "steps_trained": 2,
        "parity": [{"field": "vocab_size", "built": VOCAB, "checkpoint": VOCAB, "verdict": "match"},
                   {"field": "max_position_embeddings", "built": 256, "checkpoint": 40960,
                    "verdict": "accepted difference"}],
        "kernel_replacements": replacements,
    }
    path = tmp_path / "results" / "train_hf" / "measured.json"
    write_recorded_json(path, {"stage": "train_hf", "backend": "cpu", "figures": figures, "notes": [],
                               "artifacts": [{"path": "results/train_hf/run/metrics.jsonl", "sha256": "0" * 64,
                                              "bytes": 1}],
                               "started": "2026-12-04T10:00:00.000+00:00", "ended": "2026-12-04T10:05:00.000+00:00"})
    return path


def judging(**extra):
    return {"gate": GATE, "accepted_differences": {"max_position_embeddings": REASON}, **extra}


@pytest.fixture
def in_tmp(tmp_path, monkeypatch, stage_progress):
    monkeypatch.chdir(tmp_path)  # failure records go to results/failures/
    return tmp_path


def test_a_passing_measurement_becomes_the_stages_summary_with_the_work_s_own_timing(in_tmp):
    measured = measured_recipe(in_tmp)
    summary = run(stage="train_hf", judging=judging(), measured_path=measured,
                  summary_path=in_tmp / "results" / "train_hf" / "summary.json")
    assert summary["status"] == "pass"
    assert summary["figures"]["gate"]["gap"] == pytest.approx(7.0) and summary["figures"]["gate"]["min_gap"] == 1.0
    assert summary["figures"]["parity"][1]["verdict"] == f"accepted difference: {REASON}"
    assert (summary["started"], summary["ended"]) == ("2026-12-04T10:00:00.000+00:00", "2026-12-04T10:05:00.000+00:00")
    assert [a["path"] for a in summary["artifacts"]] == ["results/train_hf/run/metrics.jsonl", str(measured)]
    assert "7.00 nats below a random-init control" in summary["proves"]


def test_a_gate_threshold_above_the_measured_gap_fails_and_keeps_the_figures(in_tmp, stage_progress):
    measured = measured_recipe(in_tmp, loaded=11.5, control=12.0)
    with pytest.raises(TrainingError, match=r"(?s)loaded-weights gate failed:.*training\.gate\.min_gap = 1\.0 "
                                            r"\(gap 0\.5000\)"):
        run(stage="train_hf", judging=judging(), measured_path=measured, summary_path=in_tmp / "summary.json")
    assert not (in_tmp / "summary.json").exists()
    failure = write_failure("train_hf", RuntimeError("x"), in_tmp / "log", in_tmp / "kept", stage_progress.measured)
    assert failure["figures"]["gate"]["gap"] == pytest.approx(0.5) and failure["figures"]["steps"][0]["loss"] == 11.5
    assert failure_path("train_hf").exists()
    # The same figures under a threshold they meet: the stage passes without measuring again.
    summary = run(stage="train_hf", judging=judging(gate={**GATE, "min_gap": 0.4}), measured_path=measured,
                  summary_path=in_tmp / "summary.json")
    assert summary["status"] == "pass" and not failure_path("train_hf").exists()


@pytest.mark.parametrize("difference, passes", [(1e-4 * (1 - 1e-3), True), (1e-4 * (1 + 1e-3), False)])
def test_the_replaced_run_is_held_to_kernels_loss_tolerance_against_its_plain_twin(in_tmp, difference, passes):
    measured = measured_recipe(in_tmp, plain=(5.0, 4.9 + difference))
    judge = lambda: run(stage="train_hf", judging=judging(loss_tolerance=1e-4),  # noqa: E731
                        measured_path=measured, summary_path=in_tmp / "summary.json")
    if passes:
        replacements = judge()["figures"]["kernel_replacements"]
        assert "plain_steps" not in replacements and replacements["against_plain"]["tolerance"] == 1e-4
        assert replacements["against_plain"]["max_abs_loss_diff"] == pytest.approx(difference)
    else:
        with pytest.raises(TrainingError, match="kernels.loss_tolerance = 0.0001"):
            judge()


def test_a_nan_loss_in_the_replaced_run_fails_whatever_the_tolerance(in_tmp):
    measured = measured_recipe(in_tmp, plain=(5.0, 4.9))
    record = json.loads(measured.read_text())
    record["figures"]["steps"][1]["loss"] = math.nan
    write_recorded_json(measured, record)
    with pytest.raises(TrainingError, match="differ from the plain run"):
        run(stage="train_hf", judging=judging(loss_tolerance=1e9), measured_path=measured,
            summary_path=in_tmp / "summary.json")


def test_a_difference_accepted_when_the_run_was_made_but_not_by_the_judge_is_refused():
    rows = [{"field": "rope_theta", "built": 1e6, "checkpoint": 5e6, "verdict": "accepted difference"}]
    assert with_reasons(rows, {"rope_theta": "why"})[0]["verdict"] == "accepted difference: why"
    with pytest.raises(ParityError, match="rope_theta: accepted as a difference when the run was made"):
        with_reasons(rows, {})
