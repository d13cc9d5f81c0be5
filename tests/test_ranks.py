"""verify_ranks: real gloo ranks under torchrun, and every way a rank can be wrong or missing."""

from __future__ import annotations

import pytest
from conftest import backend_config

from qwen3_pilot.backends import make_backend
from qwen3_pilot.ranks import MIB, RankCheckError, bandwidth_rows, check_rank_records, verify_ranks


def record(rank, world=2, **overrides):
    base = {"rank": rank, "world_size": world, "device": "cpu", "all_reduce_sum": world * (world + 1) / 2,
            "all_gather": list(range(world)), "dist_backend": "gloo", "host": "h"}
    return {**base, **overrides}


def test_good_records_pass():
    assert check_rank_records([record(0), record(1)], 2, "cpu") == []


def test_missing_duplicate_and_wrong_ranks_are_named():
    problems = check_rank_records(
        [record(0), record(0, all_gather=[0, 0]), record(5, world=3), record(1, device="cuda:1")], 4, "cpu"
    )
    text = "\n".join(problems)
    assert "missing ranks [2, 3] (expected ranks 0..3)" in text
    assert "unexpected ranks [5]" in text
    assert "ranks reported twice: [0]" in text
    assert "rank 1: device cuda:1, expected a cpu device" in text
    assert "rank 0: all_gather = [0, 0], expected [0, 1, 2, 3]" in text


def test_ranks_of_a_multi_node_launch_must_span_as_many_hosts_as_nodes():
    two_hosts = [record(0, host="trn2-7"), record(1, host="trn2-8")]
    assert check_rank_records(two_hosts, 2, "cpu", nodes=2) == []
    assert check_rank_records([record(0), record(1)], 2, "cpu", nodes=2) == [
        "the ranks ran on 1 host(s) (h), expected nodes = 2"
    ]


def timing(collective, size_mib, seconds, correct=True):
    return {"collective": collective, "size_bytes": int(size_mib * MIB), "seconds": seconds, "correct": correct}


def test_bus_bandwidth_is_algorithm_bandwidth_times_nccl_tests_factor_from_the_slowest_rank():
    # 4 ranks; 1 MiB all-reduce and all-gather; the slowest rank took 2 ms (all-reduce) and 4 ms (all-gather).
    fast = record(0, world=4, bandwidth=[timing("all_reduce", 1, 0.001), timing("all_gather", 1, 0.001)])
    slow = record(1, world=4, bandwidth=[timing("all_reduce", 1, 0.002), timing("all_gather", 1, 0.004)])
    reduce_row, gather_row = bandwidth_rows([fast, slow], world=4)
    assert reduce_row["time_us"] == pytest.approx(2000.0) and reduce_row["size_mib"] == 1.0
    assert reduce_row["algbw_gbps"] == pytest.approx(MIB / 0.002 / 1e9)
    assert reduce_row["busbw_gbps"] == pytest.approx(MIB / 0.002 / 1e9 * 2 * 3 / 4)  # 2(n-1)/n
    assert gather_row["busbw_gbps"] == pytest.approx(MIB / 0.004 / 1e9 * 3 / 4)  # (n-1)/n
    assert reduce_row["correct"] and gather_row["correct"]


def test_a_collective_that_returned_a_wrong_result_is_named_with_its_rank_and_size():
    wrong = record(1, bandwidth=[timing("reduce_scatter", 4, 0.01, correct=False)])
    assert check_rank_records([record(0), wrong], 2, "cpu") == [
        "rank 1: reduce_scatter of 4 MiB returned a wrong result"]


@pytest.fixture
def cpu_backend(tmp_path):
    return make_backend(backend_config("cpu", 2), str(tmp_path / "cache"))


@pytest.mark.torchrun
def test_two_gloo_ranks_run_the_collectives(tmp_path, cpu_backend):
    collectives = {"sizes_mib": [1, 2], "warmup": 0, "iterations": 1}
    figures = verify_ranks(cpu_backend, tmp_path / "results", tmp_path / "log.txt", collectives=collectives)
    assert figures["ranks_seen"] == 2 and figures["all_reduce_sum"] == 3.0
    assert figures["dist_backend"] == "gloo"
    # Every collective at every size returned the known result on both ranks, and was timed.
    rows = figures["bandwidth"]
    assert [(row["collective"], row["size_mib"]) for row in rows] == [
        (name, size) for size in (1.0, 2.0) for name in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")]
    assert all(row["correct"] and row["busbw_gbps"] > 0 for row in rows)
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["rank-0.json", "rank-1.json"]


@pytest.mark.torchrun
def test_a_missing_rank_fails_with_the_rank_named(tmp_path, cpu_backend):
    with pytest.raises(RankCheckError) as raised:
        verify_ranks(cpu_backend, tmp_path / "results", tmp_path / "log.txt", nproc=1)
    assert "missing ranks [1] (expected ranks 0..1)" in str(raised.value)
    assert "rank 0: world size 1, expected 2" in str(raised.value)
