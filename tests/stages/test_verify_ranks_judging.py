"""Rule judge for verify_ranks: the measured bus bandwidth against verify_ranks.floor."""

from __future__ import annotations

import copy

import pytest

from qwen3_pilot.stages.verify_ranks_judging import BandwidthFloorError, judge_verify_ranks

FLOOR = {"bus_gbps": {"all_reduce": 1.0, "all_gather": 1.0, "reduce_scatter": 1.0, "all_to_all": None},
         "from_mib": 4, "basis": "a test's floor"}


def row(collective, size_mib, busbw):
    return {"collective": collective, "size_mib": size_mib, "time_us": 1.0, "algbw_gbps": busbw, "busbw_gbps": busbw,
            "correct": True}


def measured(rows):
    return {"live": {"ranks_seen": 2, "hosts": ["h"], "dist_backend": "gloo", "nodes": 1, "bandwidth": rows},
            "plan": {"world_size": 64, "flavor": "4B"},
            "collectives": {"sizes_mib": sorted({r["size_mib"] for r in rows}), "iterations": 3}}


def test_a_size_held_to_its_floor_and_below_it_fails_naming_the_collective_size_and_key():
    figures = measured([row("all_reduce", 4, 1.5), row("all_gather", 16, 0.5)])
    with pytest.raises(BandwidthFloorError) as failed:
        judge_verify_ranks("verify_ranks", figures, {"floor": FLOOR}, "cpu")
    message = str(failed.value)
    assert "all_gather of 16 MiB: bus bandwidth 0.5 GB/s, below verify_ranks.floor.bus_gbps.all_gather = 1" in message
    assert "a test's floor" in message and message.count("\n  - ") == 1  # the all_reduce row passed
    # The failed judgment keeps each row's floor and verdict (rule judge records the figures either way).
    assert [r["verdict"] for r in figures["live"]["bandwidth"]] == ["at or above the floor", "BELOW THE FLOOR"]


def test_sizes_below_from_mib_and_collectives_without_a_floor_are_shown_not_held():
    rows = [row("all_reduce", 1, 0.001), row("all_to_all", 16, 0.001), row("reduce_scatter", 4, 1.0)]
    figures = measured(rows)
    verdict = judge_verify_ranks("verify_ranks", figures, {"floor": FLOOR}, "cpu")
    assert [r["floor_gbps"] for r in rows] == [None, None, 1.0]
    assert rows[0]["verdict"] == "shown, not held (below 4 MiB)"
    assert rows[1]["verdict"] == "shown, not held (no floor for this collective)"
    assert rows[2]["verdict"] == "at or above the floor"  # exactly at the floor passes
    assert "1 of 3 of those reached their floor" in verdict["proves"] and figures["floor"] == FLOOR
    assert "gloo ranks on one CPU machine" in verdict["does_not_prove"]


def test_a_floor_edit_changes_the_verdict_on_the_same_figures():
    figures = measured([row("all_reduce", 8, 2.0)])
    judge_verify_ranks("verify_ranks", copy.deepcopy(figures), {"floor": FLOOR}, "neuron")
    raised = {**FLOOR, "bus_gbps": {**FLOOR["bus_gbps"], "all_reduce": 2.5}}
    with pytest.raises(BandwidthFloorError, match="all_reduce of 8 MiB"):
        judge_verify_ranks("verify_ranks", figures, {"floor": raised}, "neuron")
