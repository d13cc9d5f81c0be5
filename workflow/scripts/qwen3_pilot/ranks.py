"""The ranks (what stage verify_ranks checks): launch the configured ranks with torchrun, check each one, and
validate the 64-rank plan offline with torchtitan's fake process group."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from .backends import Backend
from .launch import Launch, failure_cause, run_torchrun
from .problems import problem_list
from .stage_progress import record_measured


class RankCheckError(RuntimeError):
    pass


def expected_collectives(world_size: int) -> dict[str, Any]:
    return {"all_reduce_sum": world_size * (world_size + 1) / 2, "all_gather": list(range(world_size))}


# The collectives verify_ranks times, and nccl-tests' bus-bandwidth factor of each over n ranks
# (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md): the share of the data each rank's link carries, so that
# bus bandwidth compares with a link's speed whatever the rank count.
BUS_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
}
MIB = 2**20


def bandwidth_rows(records: list[dict[str, Any]], world: int) -> list[dict[str, Any]]:
    """Per collective and size, from every rank's timings: the slowest rank's mean time per call, algorithm
    bandwidth (the size over that time; the size as nccl-tests counts it: the buffer for all_reduce, the whole
    gathered output for all_gather, the whole input for reduce_scatter and all_to_all) and bus bandwidth (times
    BUS_FACTORS), in GB/s (10^9 bytes), and whether every rank got the known result."""
    rows = []
    for index, first in enumerate(records[0]["bandwidth"]):
        timings = [record["bandwidth"][index] for record in records]
        seconds = max(timing["seconds"] for timing in timings)
        algbw = first["size_bytes"] / seconds / 1e9
        rows.append({"collective": first["collective"], "size_mib": first["size_bytes"] / MIB,
                     "time_us": seconds * 1e6, "algbw_gbps": algbw,
                     "busbw_gbps": algbw * BUS_FACTORS[first["collective"]](world),
                     "correct": all(timing["correct"] for timing in timings)})
    return rows


def check_rank_records(
    records: list[dict[str, Any]], expected_world: int, device_type: str, nodes: int = 1
) -> list[str]:
    """Every way the launched ranks differ from what `expected_world` ranks on `nodes` hosts should report."""
    problems = []
    hosts = sorted({r["host"] for r in records})
    if records and len(hosts) != nodes:
        # srun starting every node's torchrun on one host would still reach the world size.
        problems.append(f"the ranks ran on {len(hosts)} host(s) ({', '.join(hosts)}), expected nodes = {nodes}")
    expected = expected_collectives(expected_world)
    seen = sorted(r["rank"] for r in records)
    missing = sorted(set(range(expected_world)) - set(seen))
    extra = sorted(set(seen) - set(range(expected_world)))
    duplicated = sorted({r for r in seen if seen.count(r) > 1})
    if missing:
        problems.append(f"missing ranks {missing} (expected ranks 0..{expected_world - 1})")
    if extra:
        problems.append(f"unexpected ranks {extra} (expected ranks 0..{expected_world - 1})")
    if duplicated:
        problems.append(f"ranks reported twice: {duplicated}")
    for record in sorted(records, key=lambda r: r["rank"]):
        rank = record["rank"]
        if record["world_size"] != expected_world:
            problems.append(f"rank {rank}: world size {record['world_size']}, expected {expected_world}")
        if not record["device"].startswith(device_type):
            problems.append(f"rank {rank}: device {record['device']}, expected a {device_type} device")
        for key, want in expected.items():
            if record[key] != want:
                problems.append(f"rank {rank}: {key} = {record[key]}, expected {want}")
        problems += [f"rank {rank}: {timing['collective']} of {timing['size_bytes'] / MIB:g} MiB returned a wrong "
                     "result" for timing in record.get("bandwidth", []) if not timing["correct"]]
    return problems


def rank_worker_command(
    backend: Backend, nproc: int, out_dir: Path, python: str = sys.executable, rank_logs: Path | None = None,
    collectives: dict[str, Any] | None = None,
) -> list[str]:
    """The torchrun command of verify_ranks' launch (the preflight prints it); `collectives`: config
    verify_ranks.collectives, the sizes and iterations the ranks time (none: no timing)."""
    timing = [] if collectives is None else [
        "--sizes-mib", ",".join(f"{size:g}" for size in collectives["sizes_mib"]),
        "--warmup", str(collectives["warmup"]), "--iterations", str(collectives["iterations"])]
    return backend.torchrun_command(
        python, nproc, "qwen3_pilot.titan.in_ranks.rank_worker",
        ["--out", str(out_dir), "--dist-backend", backend.dist_backend, "--device-type", backend.device_type,
         *timing],
        rank_log_dir=rank_logs,
    )


def launch_ranks(
    backend: Backend, nproc: int, out_dir: Path, log_path: Path, python: str = sys.executable,
    collectives: dict[str, Any] | None = None,
) -> tuple[Launch, list[dict[str, Any]]]:
    """Runs the rank worker under torchrun; returns the launch and the records the ranks wrote."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("rank-*.json"):
        stale.unlink()
    rank_logs = backend.rank_log_dir(log_path, "ranks")
    command = rank_worker_command(backend, nproc, out_dir, python, rank_logs, collectives)
    result = run_torchrun(command, backend.launcher_env, log_path=log_path, pid_dir=out_dir, rank_log_dir=rank_logs)
    records = [json.loads(p.read_text()) for p in sorted(out_dir.glob("rank-*.json"))]
    return result, records


def verify_ranks(
    backend: Backend, out_dir: Path, log_path: Path, *, nproc: int | None = None,
    collectives: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Launches `nproc` ranks per node (default: the backend's ranks per node) on every node and checks
    them all against the world size (nodes x ranks per node).

    `nproc` differs from the backend's only in tests, to show that a missing rank is caught.
    """
    if backend.unavailable_reason:
        raise RankCheckError(f"{backend.name} backend cannot run here: {backend.unavailable_reason}")
    topology = check_topology(backend)
    nproc = backend.ranks_per_node if nproc is None else nproc
    launched, records = launch_ranks(backend, nproc, out_dir, log_path, collectives=collectives)
    nodes = backend.multi_node.nodes if backend.multi_node else 1
    problems = check_rank_records(records, backend.expected_ranks, backend.device_type, nodes)
    record_measured(ranks_seen=len(records), rank_records=records, problems=problems)
    if launched.returncode != 0:
        problems.insert(0, f"{failure_cause(launched)} (see {log_path})")
    if problems:
        raise RankCheckError(
            problem_list(f"verify_ranks on the {backend.name} backend failed", problems)
        )
    return {
        "expected_ranks": backend.expected_ranks,
        "nodes": nodes,
        "ranks_per_node": backend.ranks_per_node,
        "ranks_seen": len(records),
        "dist_backend": records[0]["dist_backend"],
        "devices": sorted({r["device"] for r in records}),
        "hosts": sorted({r["host"] for r in records}),
        "all_reduce_sum": records[0]["all_reduce_sum"],
        # MFU's denominator for the training stages: the backend's published peak, or the slowest rank's
        # measured one.
        "peak_flops_per_rank": backend.peak_flops_per_rank or min(r["peak_flops"] for r in records),
        "peak_flops_source": backend.peak_flops_source,
        **({"topology": topology} if topology is not None else {}),
        **({"bandwidth": bandwidth_rows(records, backend.expected_ranks)} if collectives is not None else {}),
    }


def check_topology(backend: Backend) -> dict[str, Any] | None:
    """The backend's devices against the config (neuron: neuron-ls's cores, LNC and HBM), before any rank
    starts: a wrong LNC or missing devices would otherwise show as a hang or a late rank error."""
    if backend.topology is None:
        return None
    figures, problems = backend.topology()
    if problems:
        raise RankCheckError(
            problem_list(f"the {backend.name} devices do not match the config", problems)
        )
    return figures
