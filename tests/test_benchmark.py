"""The benchmark's arithmetic on recorded metric lines: warm-up excluded, percentiles, the noisy flag, MFU,
cost, and the config error when cost is asked for without a price."""

from __future__ import annotations

import json

import pytest

from qwen3_pilot.benchmark import BenchmarkError, cost, mfu_pct, percentile, split_phases, steady_state
from qwen3_pilot.training import read_steps

# torchtitan's metric lines as titan_metrics writes them (a slow first step: startup and compilation).
TIMES = [9.0, 0.5, 0.4, 0.20, 0.21, 0.19, 0.20, 0.22, 0.18, 0.20]


def metrics_file(tmp_path, times=TIMES):
    lines = [json.dumps({
        "step": i + 1, "loss_metrics/global_avg_loss": 5.0, "grad_norm": 1.0, "throughput(tps)": 512 / t,
        "tflops": 0.01 * 0.2 / t, "mfu(%)": 1.0, "memory/max_active(GiB)": 0.5 + 0.01 * i,
        "time_metrics/end_to_end(s)": t, "time_metrics/data_loading(%)": 2.0,
    }) for i, t in enumerate(times)]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(reversed(lines)) + "\n")  # out of order on purpose
    return path


def test_steady_state_never_includes_a_warmup_step(tmp_path):
    steps = read_steps(metrics_file(tmp_path))
    warm, steady = split_phases(steps, 3)
    assert [s["step"] for s in warm] == [1, 2, 3] and [s["step"] for s in steady] == list(range(4, 11))
    figures = steady_state(steps, warmup=3, ranks=2, peak_flops_per_rank=1e10, noisy_cv=0.1)
    assert figures["step_time_s"]["median"] == pytest.approx(0.20)
    assert figures["warmup_step_time_s"] == [9.0, 0.5, 0.4]
    assert figures["steady_steps"] == 7 and not figures["noisy"]
    assert figures["tokens_per_s_per_rank"] == pytest.approx(2560) and figures["tokens_per_s_per_instance"] == pytest.approx(5120)
    assert figures["mfu_pct"] == pytest.approx(100 * 0.01e12 / 1e10)
    assert figures["peak_memory_gib_per_rank"] == pytest.approx(0.59)  # over the whole run
    assert figures["data_wait_pct"] == pytest.approx(2.0)


def test_percentiles_interpolate_between_ranks():
    values = [0.18, 0.19, 0.20, 0.20, 0.21, 0.22, 0.20]
    assert percentile(values, 50) == pytest.approx(0.20)
    assert percentile(values, 10) == pytest.approx(0.186)
    assert percentile(values, 90) == pytest.approx(0.214)
    assert percentile([1.0], 90) == 1.0


def test_a_steady_phase_above_the_cv_threshold_is_flagged_noisy(tmp_path):
    steps = read_steps(metrics_file(tmp_path, [9.0, 0.2, 0.2, 0.4, 0.2, 0.4, 0.2]))
    figures = steady_state(steps, warmup=1, ranks=1, peak_flops_per_rank=1e10, noisy_cv=0.1)
    assert figures["step_time_s"]["cv"] == pytest.approx(0.3536, abs=1e-4) and figures["noisy"]
    with pytest.raises(BenchmarkError, match="7 steps logged, 7 of them warm-up"):
        steady_state(steps, warmup=7, ranks=1, peak_flops_per_rank=1e10, noisy_cv=0.1)


def test_cost_per_million_tokens_and_of_the_warmup():
    figures = cost(price_per_hour=36.0, tokens_per_s_per_instance=10_000, warmup_s=600)
    assert figures["per_million_tokens"] == pytest.approx(1.0)  # 36 $/h = 0.01 $/s; 1e6 tokens = 100 s
    assert figures["warmup"] == pytest.approx(6.0)


def test_mfu_against_the_backends_peak():
    assert mfu_pct(79.0, 158e12) == pytest.approx(50.0)
    with pytest.raises(BenchmarkError, match="MFU needs a positive peak"):
        mfu_pct(1.0, 0.0)
