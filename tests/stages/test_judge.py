"""Rule judge: a measuring stage's measured.json held to the configured thresholds, into its summary."""

from __future__ import annotations

import json
import math

import pytest

from qwen3_pilot.artifacts import write_recorded_json
from qwen3_pilot.stages.judge import run
from qwen3_pilot.summary import failure_path, write_failure
from qwen3_pilot.titan.parity import ParityError, with_reasons
from qwen3_pilot.trainer_run import TrainingError

VOCAB = 151936
GATE = {"min_gap": 1.0, "control_below_ln_vocab": 0.5, "control_above_ln_vocab": 1.5}
REASON = "set to training.seq_len by torchtitan's transformers backend"
MEASURED_BY = {"digest": "e" * 64, "commit": "f" * 40, "dirty": False}


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
                               "started": "2026-12-04T10:00:00.000+00:00", "ended": "2026-12-04T10:05:00.000+00:00",
                               "code": MEASURED_BY})
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
    assert summary["code"]["measured"] == MEASURED_BY  # the judge keeps which code measured what it judged


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


def measured_record(tmp_path, stage, figures):
    path = tmp_path / "results" / stage / "measured.json"
    write_recorded_json(path, {"stage": stage, "backend": "cpu", "figures": figures, "notes": [], "artifacts": [],
                               "started": "2026-12-04T10:00:00.000+00:00", "ended": "2026-12-04T10:01:00.000+00:00"})
    return path


def measured_numerics(tmp_path, rope_bfloat16_diff):
    """kernel_numerics' measured figures as its stage writes them: differences, no tolerance, no verdict."""
    trained = {"losses_reference": [5.0, 4.9], "losses_replaced": [5.0, 4.9], "max_abs_loss_diff": 0.0,
               "finite": True, "seconds": 1.0}
    return measured_record(tmp_path, "kernel_numerics", {
        "numerics": [
            {"section": "rope", "op": "rope_forward_q", "dtype": "bfloat16", "shape": [1, 256, 4, 64],
             "max_abs_diff": rope_bfloat16_diff, "max_ulp_diff": rope_bfloat16_diff / 2.0**-6, "max_abs_input": 4.0},
            {"section": "moe", "op": "moe_forward", "dtype": "float32", "shape": [64, 32], "max_abs_diff": 0.0,
             "max_ulp_diff": 0.0, "impl": "grouped_experts_swiglu", "reference": "looped_experts_swiglu"}],
        "largest_diff_per_dtype": {"rope": {"bfloat16": rope_bfloat16_diff}, "moe": {"float32": 0.0}},
        "seq_len_rule": {"applies": False, "verdict": "pass"},
        "replacement_counts": {"dense": {"rope_hf": 2}},
        "replaced_model_trains": {"dense": trained},
        "compile": {"models": {"dense": {"backend": "aot_eager", "logits_max_abs_diff": 0.0, "grad_max_abs_diff": 0.0,
                                         "seconds": 1.0}}},
        "device": "cpu", "implementations": {"rope_hf": "PyTorch", "moe_grouped_experts": "torch._grouped_mm"},
    })


def numerics_judging(rope_bfloat16):
    return {"rope": {"tolerances": {"float32": 1e-6, "bfloat16": rope_bfloat16}},
            "moe": {"tolerances": {"float32": 1e-5, "bfloat16": 3.2e-2}},
            "train": {"tiny_model_loss_tolerance": 1e-5}, "compile": {"tolerances": {"dense": 1e-5}}}


def test_kernel_numerics_is_judged_by_its_tolerances_and_re_judged_without_measuring(in_tmp, stage_progress):
    from qwen3_pilot.stages.kernel_numerics.judging import NumericsError
    from qwen3_pilot.stages.kernel_numerics.rope_checks import bf16_stepwise_rope_bound

    measured = measured_numerics(in_tmp, rope_bfloat16_diff=0.04)
    summary_path = in_tmp / "results" / "kernel_numerics" / "summary.json"
    with pytest.raises(NumericsError, match=r"rope: rope_forward_q bfloat16 shape \[1, 256, 4, 64\]: max abs diff "
                                            r"0\.04 > tolerance 0\.032"):
        run(stage="kernel_numerics", judging=numerics_judging(3.2e-2), measured_path=measured,
            summary_path=summary_path)
    assert not summary_path.exists()
    assert stage_progress.measured["numerics"][0]["verdict"] == "fail"  # the failure record keeps the figures
    # The bound a kernel that rounds at every step may reach, from the largest input measured (4.0): about 0.107.
    summary = run(stage="kernel_numerics", judging=numerics_judging("bf16_stepwise"), measured_path=measured,
                  summary_path=summary_path)
    rope_row = summary["figures"]["numerics"][0]
    assert (rope_row["tolerance"], rope_row["verdict"]) == (bf16_stepwise_rope_bound(4.0), "pass")
    assert summary["figures"]["replaced_model_trains"]["dense"]["tolerance"] == 1e-5
    assert summary["figures"]["compile"]["models"]["dense"]["verdict"] == "pass"
    assert "On the cpu device" in summary["proves"] and "torch.compile (aot_eager) gives the eager result" in (
        summary["proves"])


def test_export_reload_is_judged_by_its_logits_tolerance(in_tmp):
    from qwen3_pilot.stages.export_reload.hf_export import ExportError

    logits = {"max_abs_diff": 2e-4, "argmax_agreement": 1.0, "logits_max_abs": 3.0, "inputs": [2, 64]}
    measured = measured_record(in_tmp, "export_reload", {
        "hf": {"logits_vs_torchtitan": dict(logits)}, "native": {"logits_vs_torchtitan": dict(logits)},
        "recipes_agree": {"same_keys_and_dtypes": True, "keys": 3}})
    summary_path = in_tmp / "summary.json"
    with pytest.raises(ExportError, match=r"hf: reloaded logits differ from torchtitan's by 2\.000e-04"):
        run(stage="export_reload", judging={"logits_tolerance": 1e-4, "min_argmax_agreement": 0.99},
            measured_path=measured, summary_path=summary_path)
    summary = run(stage="export_reload", judging={"logits_tolerance": 1e-3, "min_argmax_agreement": 0.99},
                  measured_path=measured, summary_path=summary_path)
    assert summary["status"] == "pass" and summary["figures"]["native"]["logits_vs_torchtitan"]["tolerance"] == 1e-3
