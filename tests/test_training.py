"""The training stage's torch-free parts: launching, reading torchtitan's metrics, and the gates."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from qwen3_pilot.launch import PID_FILE, Launch
from qwen3_pilot.stages.compare_recipes import run as compare_recipes
from qwen3_pilot.stages.train_judging import loaded_weights_gate, loss_agreement, repeat_problems
from qwen3_pilot.summary import write_failure
from qwen3_pilot.trainer_run import TrainingError
from qwen3_pilot.training import (
    check_steps,
    clear_run_dir,
    control_changes,
    export_files,
    launch_failure,
    read_steps,
    read_validation,
    repeat_figures,
    replacement_check,
)

GATE = {"min_gap": 1.0, "control_below_ln_vocab": 0.5, "control_above_ln_vocab": 1.5}


def metrics_line(step, loss, **extra):
    return json.dumps({"step": step, "loss_metrics/global_avg_loss": loss, "grad_norm": 1.0, "throughput(tps)": 10.0,
                       "tflops": 0.1, "mfu(%)": 50.0, "memory/max_active(GiB)": 0.5, "time_metrics/end_to_end(s)": 0.2,
                       "time_metrics/data_loading(%)": 1.5, **extra})


def test_read_steps_maps_torchtitan_names_and_reads_non_finite_strings(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(metrics_line(1, 5.5) + "\n" + metrics_line(2, "nan") + "\n")
    steps = read_steps(path)
    assert steps[0] == {"step": 1, "loss": 5.5, "grad_norm": 1.0, "tokens_per_s": 10.0, "tflops": 0.1,
                        "mfu_pct": 50.0, "peak_memory_gib": 0.5, "step_time_s": 0.2, "data_wait_pct": 1.5}
    assert math.isnan(steps[1]["loss"])
    with pytest.raises(TrainingError, match="loss is nan at step 2"):
        check_steps(steps, 2, path)


def test_check_steps_names_an_infinite_loss_and_missing_steps(tmp_path):
    steps = read_steps_from(tmp_path, [(1, 5.0), (2, "inf")])
    with pytest.raises(TrainingError, match="loss is inf at step 2"):
        check_steps(steps, 2, tmp_path)
    with pytest.raises(TrainingError, match=r"logged steps \[1\], expected 1..10"):
        check_steps(steps[:1], 10, tmp_path)
    check_steps(steps[:1], 1, tmp_path)


def read_steps_from(tmp_path, pairs):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(metrics_line(step, loss) + "\n" for step, loss in pairs))
    return read_steps(path)


def test_gate_passes_on_a_clear_gap_with_an_uninformed_control():
    figures, problems = loaded_weights_gate(6.54, 12.43, 151936, {**GATE, "control_above_ln_vocab": 1.0})
    assert problems == []
    assert figures["ln_vocab"] == pytest.approx(11.931, abs=1e-3)
    assert figures["gap"] == pytest.approx(5.89)


def test_gate_fails_when_the_loaded_loss_is_at_the_control():
    _, problems = loaded_weights_gate(11.9, 12.0, 151936, GATE)
    assert len(problems) == 1 and "the weights did not load" in problems[0]


def test_gate_fails_when_the_control_is_not_near_ln_vocab():
    _, problems = loaded_weights_gate(2.0, 5.0, 151936, GATE)
    assert len(problems) == 1 and "the control is not an uninformed model" in problems[0]
    _, problems = loaded_weights_gate(2.0, math.nan, 151936, GATE)
    assert len(problems) == 2


def test_launch_failure_prefers_the_models_differences_from_config_json(tmp_path):
    failed = Launch([], {}, 1, 1.0, log_path=tmp_path / "log")
    error = launch_failure("train_native", failed, tmp_path / "parity.json")
    assert "torchrun exited with code 1: no rank recorded an error" in str(error)
    (tmp_path / "parity.json").write_text(
        json.dumps({"problems": ["rope_theta: built 1.0, checkpoint config.json 5.0"]}))
    error = launch_failure("train_native", failed, tmp_path / "parity.json")
    assert "torchrun exited with code 1: the model differs from the checkpoint's config.json" in str(error)
    assert "rope_theta: built 1.0" in str(error)


def test_clear_run_dir_stops_orphaned_ranks_and_empties_the_folder(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoint" / "step-10").mkdir(parents=True)
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    (run / PID_FILE).write_text(str(orphan.pid))
    clear_run_dir(run)
    assert orphan.wait(timeout=10) == -9
    assert run.is_dir() and list(run.iterdir()) == []


def write_gate_summary(path, loaded, control):
    path.write_text(json.dumps({"figures": {"gate": {"step1_loss_loaded": loaded, "step1_loss_random_init": control}}}))
    return path


def test_compare_recipes_reports_the_difference_and_fails_past_the_tolerance(tmp_path, monkeypatch, stage_progress):
    hf = write_gate_summary(tmp_path / "hf.json", 5.6081, 11.6)
    native = write_gate_summary(tmp_path / "native.json", 5.6082, 7.6)
    summary = compare_recipes(hf_summary=hf, native_summary=native, tolerance=1e-3, backend="cpu",
                                    summary_path=tmp_path / "summary.json")
    assert summary["figures"]["abs_difference"] == pytest.approx(1e-4)
    far = write_gate_summary(tmp_path / "far.json", 7.0, 7.6)
    monkeypatch.chdir(tmp_path)  # the failure record goes to results/failures/
    with pytest.raises(TrainingError, match="step-1 losses differ by 1.391900"):
        compare_recipes(hf_summary=hf, native_summary=far, tolerance=1e-3, backend="cpu",
                        summary_path=tmp_path / "summary2.json")
    # Measured before judged: the failure record gets the figures that failed.
    failure = write_failure("compare_recipes", RuntimeError("x"), tmp_path / "log", tmp_path / "kept",
                            stage_progress.measured)
    assert failure["figures"]["abs_difference"] == pytest.approx(1.3919, abs=1e-4)


# ---- kernel replacements in training: the launch log, and replaced against plain ----


def launch_with_output(tmp_path, text):
    log = tmp_path / "stage.log"
    log.write_text("an earlier launch: kernel replacement: "
                   "rope_hf layers.9.attention.rope CosSinRoPE -> HFLayoutRoPE [x]\n")
    start = log.stat().st_size
    log.write_text(log.read_text() + text)
    return Launch([], {}, 0, 1.0, log_path=log, log_start=start, log_end=log.stat().st_size)


def replacement_line(layer, kernel="rope_hf"):
    return f"[rank0]: kernel replacement: {kernel} layers.{layer}.attention.rope CosSinRoPE -> HFLayoutRoPE [PyTorch]\n"


RULES = [{"kernel": "rope_hf", "layers": "*"}]


def test_replacement_check_reads_only_its_own_launch_and_counts_per_kernel(tmp_path):
    run = launch_with_output(tmp_path, replacement_line(0) + "step 1 loss 5.0\n" + replacement_line(1))
    figures = replacement_check("train_native", run, RULES, n_layers=2)
    assert figures["per_kernel"]["rope_hf"]["replaced"] == 2
    assert figures["per_kernel"]["rope_hf"]["implementation"] == "PyTorch"
    assert figures["log_lines"][0] == "rope_hf layers.0.attention.rope CosSinRoPE -> HFLayoutRoPE [PyTorch]"


def test_replacement_check_fails_naming_the_layers(tmp_path):
    run = launch_with_output(tmp_path, replacement_line(0) + replacement_line(0))
    with pytest.raises(TrainingError, match=r"(?s)train_native: kernel replacements in the launch log.*"
                                            r"no replacement logged in layer\(s\) 1 .*"
                                            r"2 replacements logged in layer 0"):
        replacement_check("train_native", run, RULES, n_layers=2)


def steps_of(*losses):
    return [{"step": i + 1, "loss": loss} for i, loss in enumerate(losses)]


def test_loss_agreement_compares_every_step():
    figures, problems = loss_agreement(steps_of(5.0, 4.9), steps_of(5.0, 4.90001), tolerance=1e-4)
    assert problems == [] and figures["max_abs_loss_diff"] == pytest.approx(1e-5)
    assert figures["steps"][1] == {"step": 2, "loss_replaced": 4.9, "loss_plain": 4.90001,
                                   "abs_diff": pytest.approx(1e-5)}
    _, problems = loss_agreement(steps_of(5.0, 4.9), steps_of(5.0, 4.8), tolerance=1e-4)
    assert problems == ["losses with the kernel replacements differ from the plain run by up to 0.1 "
                        "(first past the tolerance at step 2); "
                        "kernels.loss_tolerance = 0.0001"]
    _, problems = loss_agreement(steps_of(5.0, math.nan), steps_of(5.0, 4.8), tolerance=1e-4)
    assert problems and "differ" in problems[0]
    _, problems = loss_agreement(steps_of(5.0), steps_of(5.0, 4.8), tolerance=1e-4)
    assert problems == ["the replaced run logged 1 steps, the plain run 2"]


# ---- each gate at its threshold: a figure just within passes, just beyond fails ----

# Far above float64 rounding at these magnitudes, far below any threshold the config sets.
JUST = 1e-9


@pytest.mark.parametrize("gap, passes", [(1.0 + JUST, True), (1.0, True), (1.0 - JUST, False)])
def test_the_loaded_weights_gate_holds_the_gap_to_training_gate_min_gap(gap, passes):
    control = 12.0  # inside the band around ln(151936) = 11.93
    figures, problems = loaded_weights_gate(control - gap, control, 151936, GATE)  # min_gap 1.0
    assert figures["min_gap"] == 1.0
    if passes:
        assert problems == []
    else:
        assert len(problems) == 1 and "by training.gate.min_gap = 1.0 (gap 1.0000)" in problems[0]


LN_VOCAB = math.log(151936)


@pytest.mark.parametrize("control, passes", [
    (LN_VOCAB - 0.5 + JUST, True), (LN_VOCAB - 0.5 - JUST, False),  # control_below_ln_vocab = 0.5
    (LN_VOCAB + 1.5 - JUST, True), (LN_VOCAB + 1.5 + JUST, False),  # control_above_ln_vocab = 1.5
])
def test_the_loaded_weights_gate_holds_the_control_to_its_band_around_ln_vocab(control, passes):
    _, problems = loaded_weights_gate(control - 5.0, control, 151936, GATE)
    if passes:
        assert problems == []
    else:
        assert len(problems) == 1 and "the control is not an uninformed model" in problems[0]


@pytest.mark.parametrize("difference, passes", [(1e-4 * (1 - 1e-3), True), (1e-4 * (1 + 1e-3), False)])
def test_loss_agreement_holds_every_step_to_kernels_loss_tolerance(difference, passes):
    _, problems = loss_agreement(steps_of(5.0, 4.9 + difference), steps_of(5.0, 4.9), tolerance=1e-4)
    if passes:
        assert problems == []
    else:
        assert problems == ["losses with the kernel replacements differ from the plain run by up to 0.0001 (first past "
                            "the tolerance at step 2); kernels.loss_tolerance = 0.0001"]


@pytest.mark.parametrize("difference, passes", [(1e-3 * (1 - 1e-3), True), (1e-3 * (1 + 1e-3), False)])
def test_compare_recipes_holds_the_step1_losses_to_recipe_agreement_tolerance(tmp_path, monkeypatch, difference,
                                                                            passes):
    monkeypatch.chdir(tmp_path)  # a failure record goes to results/failures/
    hf = write_gate_summary(tmp_path / "hf.json", 5.6, 11.6)
    native = write_gate_summary(tmp_path / "native.json", 5.6 + difference, 7.6)
    compare = lambda: compare_recipes(hf_summary=hf, native_summary=native, tolerance=1e-3,  # noqa: E731
                                      backend="cpu", summary_path=tmp_path / "summary.json")
    if passes:
        assert compare()["status"] == "pass"
    else:
        with pytest.raises(TrainingError, match=r"step-1 losses differ by 0\.001001 .*"
                                                r"training\.recipe_agreement_tolerance = 0\.001"):
            compare()


def losses(*values):
    return [{"step": step, "loss": value} for step, value in enumerate(values, 1)]


def test_a_repeated_launch_one_ulp_apart_fails_a_zero_tolerance_naming_the_step_and_key():
    first = losses(7.5, 7.25, 7.0)
    second = losses(7.5, 7.25, math.nextafter(7.0, 8.0))
    repeat = repeat_figures(first, second)
    assert not repeat["bit_identical"] and repeat["max_abs_loss_diff"] == math.ulp(7.0)
    (problem,) = repeat_problems(repeat, 0.0)
    assert "first past the tolerance at step 3" in problem and "training.repeat.loss_tolerance = 0.0" in problem
    assert repeat_problems(repeat_figures(first, second), 1e-12) == []


def test_identical_launches_are_bit_identical_and_pass_a_zero_tolerance():
    repeat = repeat_figures(losses(7.5, 7.25), losses(7.5, 7.25))
    assert repeat["bit_identical"] and repeat["max_abs_loss_diff"] == 0.0 and repeat_problems(repeat, 0.0) == []
    assert repeat["tolerance"] == 0.0  # recorded with the verdict


def test_the_control_runs_the_repeated_steps_or_its_one_step():
    assert control_changes(3) == {"use_checkpoint": False, "steps": 3}
    assert control_changes(0) == {"use_checkpoint": False, "steps": 1}


def test_validation_lines_are_read_apart_from_the_training_steps(tmp_path):
    """torchtitan's validator logs through the same loggers, under the step it followed: a validation line read as a
    step would make the steps 1, 1, 2 and fail the run."""
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("\n".join(json.dumps(record) for record in (
        {"step": 1, "loss_metrics/global_avg_loss": 6.5}, {"step": 1, "validation_metrics/loss": 6.25},
        {"step": 2, "loss_metrics/global_avg_loss": 6.0}, {"step": 2, "validation_metrics/loss": "nan"})) + "\n")
    assert [(s["step"], s["loss"]) for s in read_steps(metrics)] == [(1, 6.5), (2, 6.0)]
    held = read_validation(metrics)
    assert held[0] == {"step": 1, "loss": 6.25} and held[1]["step"] == 2 and math.isnan(held[1]["loss"])


def test_an_export_without_safetensors_fails_the_stage_naming_the_folder(tmp_path):
    """train and fail_fast both read the export through export_files: an index with no shard is no export."""
    step = tmp_path / "checkpoint" / "step-2"
    step.mkdir(parents=True)
    (step / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(TrainingError, match=rf"train_hf: no safetensors export in {step}"):
        export_files("train_hf", tmp_path, 2)
    (step / "model.safetensors").write_bytes(b"")
    assert [p.name for p in export_files("train_hf", tmp_path, 2)] == ["model.safetensors",
                                                                       "model.safetensors.index.json"]
