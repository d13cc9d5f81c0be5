"""verify_ranks: real gloo ranks under torchrun, and every way a rank can be wrong or missing."""

from __future__ import annotations

import pytest
from conftest import backend_config

from qwen3_pilot.backends import make_backend
from qwen3_pilot.ranks import RankCheckError, check_rank_records, verify_ranks


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


@pytest.fixture
def cpu_backend(tmp_path):
    return make_backend(backend_config("cpu", 2), str(tmp_path / "cache"))


@pytest.mark.torchrun
def test_two_gloo_ranks_run_the_collectives(tmp_path, cpu_backend):
    figures = verify_ranks(cpu_backend, tmp_path / "results", tmp_path / "log.txt")
    assert figures["ranks_seen"] == 2 and figures["all_reduce_sum"] == 3.0
    assert figures["dist_backend"] == "gloo"
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["rank-0.json", "rank-1.json"]


@pytest.mark.torchrun
def test_a_missing_rank_fails_with_the_rank_named(tmp_path, cpu_backend):
    with pytest.raises(RankCheckError) as raised:
        verify_ranks(cpu_backend, tmp_path / "results", tmp_path / "log.txt", nproc=1)
    assert "missing ranks [1] (expected ranks 0..1)" in str(raised.value)
    assert "rank 0: world size 1, expected 2" in str(raised.value)
