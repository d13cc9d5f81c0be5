"""The training stage's torch-free parts: launching, reading torchtitan's metrics, and the gates."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from qwen3_pilot.training import (
    PID_FILE,
    Launch,
    TrainingError,
    check_steps,
    clear_run_dir,
    compare_recipes_stage,
    failure_reason,
    launch_failure,
    loaded_weights_gate,
    read_steps,
)

GATE = {"min_gap": 1.0, "control_below_ln_vocab": 0.5, "control_above_ln_vocab": 1.5}


def metrics_line(step, loss, **extra):
    return json.dumps({"step": step, "loss_metrics/global_avg_loss": loss, "grad_norm": 1.0, "throughput(tps)": 10.0,
                       "tflops": 0.1, "mfu(%)": 50.0, "memory/max_active(GiB)": 0.5, "time_metrics/end_to_end(s)": 0.2,
                       **extra})


def test_read_steps_maps_torchtitan_names_and_reads_non_finite_strings(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(metrics_line(1, 5.5) + "\n" + metrics_line(2, "nan") + "\n")
    steps = read_steps(path)
    assert steps[0] == {"step": 1, "loss": 5.5, "grad_norm": 1.0, "tokens_per_s": 10.0, "tflops": 0.1,
                        "mfu_pct": 50.0, "peak_memory_gib": 0.5, "step_time_s": 0.2}
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


def test_failure_reason_takes_the_ranks_exception_not_torchruns_summary():
    output = "\n".join([
        "[rank0]: Traceback (most recent call last):",
        "[rank0]:   File \"x.py\", line 1",
        "[rank0]: qwen3_pilot.parity.ParityError: train_native: head_dim differs",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    ])
    assert failure_reason(output) == "ParityError: train_native: head_dim differs"
    assert failure_reason("nothing here") == "no exception found in the output"


def test_failure_reason_keeps_a_multi_line_message_and_stops_at_the_next_record():
    output = "\n".join([
        "[rank0]: TypeError: (): incompatible function arguments. The following argument types are supported:",
        "[rank0]:     1. (self: BarrierOptions, arg0: Sequence[int]) -> None",
        "",
        "[rank0]: Invoked with: <BarrierOptions object>, ['cpu']",
        "E1203 06:40:33.256000 6956 api.py:1002] failed (exitcode: 1)",
    ])
    assert failure_reason(output) == (
        "TypeError: (): incompatible function arguments. The following argument types are supported: "
        "1. (self: BarrierOptions, arg0: Sequence[int]) -> None Invoked with: <BarrierOptions object>, ['cpu']"
    )


def test_launch_failure_names_the_signal_and_prefers_parity_problems(tmp_path):
    log = tmp_path / "log"
    log.write_text("earlier run: ValueError: old\n")
    offset = log.stat().st_size
    log.write_text(log.read_text() + "RuntimeError: this run\n")
    killed = Launch(command=[], env={}, returncode=-9, wall_s=1.0)
    error = launch_failure("train_native", killed, log, offset, tmp_path / "parity.json")
    assert "killed by signal 9" in str(error) and "RuntimeError: this run" in str(error) and "old" not in str(error)
    (tmp_path / "parity.json").write_text(json.dumps({"problems": ["rope_theta: built 1.0, checkpoint config.json 5.0"]}))
    error = launch_failure("train_native", Launch([], {}, 1, 1.0), log, offset, tmp_path / "parity.json")
    assert "exited with code 1" in str(error) and "rope_theta: built 1.0" in str(error)


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


def test_compare_recipes_reports_the_difference_and_fails_past_the_tolerance(tmp_path):
    hf = write_gate_summary(tmp_path / "hf.json", 5.6081, 11.6)
    native = write_gate_summary(tmp_path / "native.json", 5.6082, 7.6)
    summary = compare_recipes_stage(hf_summary=hf, native_summary=native, tolerance=1e-3, backend="cpu",
                                    summary_path=tmp_path / "summary.json")
    assert summary["figures"]["abs_difference"] == pytest.approx(1e-4)
    far = write_gate_summary(tmp_path / "far.json", 7.0, 7.6)
    with pytest.raises(TrainingError, match="step-1 losses differ by 1.391900"):
        compare_recipes_stage(hf_summary=hf, native_summary=far, tolerance=1e-3, backend="cpu",
                              summary_path=tmp_path / "summary2.json")
