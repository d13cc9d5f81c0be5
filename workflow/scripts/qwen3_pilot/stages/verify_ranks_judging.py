"""Rule judge for verify_ranks: the bus bandwidth the ranks measured, held to verify_ranks.floor. Apart from what
the stage measures with (stages/verify_ranks.py, ranks.py), which never imports it: a floor edit re-judges and
launches nothing (parse_time/code.py)."""

from __future__ import annotations

from typing import Any

from ..problems import problem_list


class BandwidthFloorError(RuntimeError):
    pass


def held_rows(rows: list[dict[str, Any]], floor: dict[str, Any]) -> list[str]:
    """Each row given its floor and verdict (in place): `held` when its collective has a floor and its size is at
    least floor.from_mib, else `shown` with why; the problems of the rows held and below their floor."""
    problems = []
    for row in rows:
        minimum = floor["bus_gbps"].get(row["collective"])
        row["floor_gbps"] = minimum if row["size_mib"] >= floor["from_mib"] else None
        if minimum is None:
            row["verdict"] = "shown, not held (no floor for this collective)"
        elif row["size_mib"] < floor["from_mib"]:
            row["verdict"] = f"shown, not held (below {floor['from_mib']:g} MiB)"
        elif row["busbw_gbps"] >= minimum:
            row["verdict"] = "at or above the floor"
        else:
            row["verdict"] = "BELOW THE FLOOR"
            problems.append(f"{row['collective']} of {row['size_mib']:g} MiB: bus bandwidth {row['busbw_gbps']:.3g} "
                            f"GB/s, below verify_ranks.floor.bus_gbps.{row['collective']} = {minimum:g}")
    return problems


def judge_verify_ranks(stage: str, figures: dict[str, Any], judging: dict[str, Any], backend: str) -> dict[str, str]:
    """The measured bus bandwidth of every collective and size against `judging` (verify_ranks.floor), recorded into
    each row and into figures["floor"]; fails naming each row below its floor. Returns proves and does_not_prove."""
    floor = figures["floor"] = judging["floor"]
    live, plan = figures["live"], figures["plan"]
    rows = live.get("bandwidth", [])
    problems = held_rows(rows, floor)
    if problems:
        raise BandwidthFloorError(problem_list(
            f"verify_ranks: the collectives are slower than the floor (basis: {floor['basis']})", problems))
    held = [row for row in rows if row["floor_gbps"] is not None]
    sizes = ", ".join(f"{size:g}" for size in figures["collectives"]["sizes_mib"])
    return {
        "proves": (
            f"{live['ranks_seen']} ranks on {len(live['hosts'])} host(s) ({', '.join(live['hosts'])}) joined one "
            f"{live['dist_backend']} process group with the expected rank numbers and world size, and an all-reduce "
            "and an all-gather returned the known results on every rank; all-reduce, all-gather, reduce-scatter "
            f"and all-to-all returned the known result on every rank at {sizes} MiB, each timed over "
            f"{figures['collectives']['iterations']} calls (the slowest rank's mean) with algorithm and bus "
            f"bandwidth as nccl-tests defines them; {len(held)} of {len(rows)} of those reached their floor "
            f"(verify_ranks.floor, from {floor['from_mib']:g} MiB; basis: {floor['basis']}). The "
            f"{plan['world_size']}-way FSDP plan of the real Qwen3-{plan['flavor']} architecture (torchtitan fake "
            "process group) fits the per-rank HBM budget for parameters, gradients and AdamW state."
        ),
        "does_not_prove": (
            (f"These were gloo ranks on {'one CPU machine' if live['nodes'] == 1 else 'CPU hosts'}, not the "
             "NeuronCores of a trn2. " if backend == "cpu" else "")
            + "The plan counts static memory only: activations, compiler workspace and communication buffers are "
            "not in it, and the fake process group moves no data. The bandwidths are this launch's, through "
            f"torch.distributed's {live['dist_backend']} process group, one launch being one sample; a floor is "
            "only as good as its basis, and a collective with no floor, or a size below from_mib, is shown, not "
            "held."
        ),
    }
