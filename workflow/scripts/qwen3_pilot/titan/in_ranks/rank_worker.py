"""One rank of `verify_ranks`, started by torchrun: joins the process group, runs two collectives with
known results, times all-reduce, all-gather, reduce-scatter and all-to-all at each configured size (each
result checked against the known one), and writes what it saw to <out>/rank-<rank>.json."""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record

from ...artifacts import write_json
from ...backends import collective_count_dtype
from ...lifetime import die_with_parent


def device_for(device_type: str, local_rank: int):
    """The rank's torch device. On neuron torch_neuronx is imported first: it registers the `neuron`
    device type, and torch.device("neuron", n) raises before that."""
    if device_type == "neuron":
        from ...backends.neuron.in_process import import_torch_neuronx

        import_torch_neuronx()
    import torch

    return torch.device("cpu") if device_type == "cpu" else torch.device(device_type, local_rank)


def known_collectives(rank: int, world: int, device) -> dict:
    """An all_reduce of rank + 1 (sum: world x (world + 1) / 2) and an all_gather of the rank numbers in the
    default process group, as this rank saw them, with the device the tensors lived on."""
    import torch
    import torch.distributed as dist

    # float32 and int32: Neuron's collectives take no 64-bit types.
    summed = torch.tensor([float(rank + 1)], dtype=torch.float32, device=device)
    dist.all_reduce(summed, op=dist.ReduceOp.SUM)
    count = collective_count_dtype()
    gathered = [torch.zeros(1, dtype=count, device=device) for _ in range(world)]
    dist.all_gather(gathered, torch.tensor([rank], dtype=count, device=device))
    return {
        "device": str(summed.device),
        "all_reduce_sum": summed.item(),
        "all_gather": [int(t.item()) for t in gathered],
    }


def synchronize(device) -> None:
    """Waits for the device's queued work (a collective on an accelerator returns before it ends)."""
    if device.type != "cpu":
        import torch

        torch.get_device_module(device.type).synchronize()


def collective_calls(rank: int, world: int, elements: int, device) -> dict:
    """Per collective: (a call that runs it once on buffers made here, the check of its last result). Each
    input holds values whose result is known exactly in float32: rank + 1 summed, or the sender's numbers."""
    import torch
    import torch.distributed as dist

    def filled(count: int, value: float):
        return torch.full((count,), float(value), dtype=torch.float32, device=device)

    chunk = elements // world
    total = world * (world + 1) / 2
    summed, gathered, scattered, exchanged = (filled(elements, 0), filled(elements, -1), filled(chunk, 0),
                                              filled(elements, -1))
    # all_to_all: rank r sends its chunk j, filled with r x world + j, to rank j, so chunk i of what it
    # receives holds i x world + r.
    ranks = torch.arange(world, dtype=torch.float32, device=device)
    outgoing = ranks.repeat_interleave(chunk) + rank * world
    expected_exchange = (ranks * world + rank).repeat_interleave(chunk)
    expected_gather = ranks.repeat_interleave(chunk)
    own, contribution = filled(chunk, rank), filled(elements, rank + 1)

    def all_reduce():
        summed.fill_(rank + 1)  # in place: refilled so the result checked is one call's
        dist.all_reduce(summed)

    return {
        "all_reduce": (all_reduce, lambda: bool((summed == total).all())),
        "all_gather": (lambda: dist.all_gather_into_tensor(gathered, own),
                       lambda: bool(torch.equal(gathered, expected_gather))),
        "reduce_scatter": (lambda: dist.reduce_scatter_tensor(scattered, contribution),
                           lambda: bool((scattered == total).all())),
        "all_to_all": (lambda: dist.all_to_all_single(exchanged, outgoing),
                       lambda: bool(torch.equal(exchanged, expected_exchange))),
    }


def timed_collectives(rank: int, world: int, device, sizes_mib: list[float], warmup: int, iterations: int) -> list:
    """Each collective at each size: `warmup` calls, then `iterations` timed in a row between barriers, this
    rank's mean seconds per call, and whether the last call's result was the known one. The size is the
    float32 buffer nccl-tests counts (rounded down to whole elements per rank)."""
    import time

    import torch.distributed as dist

    timings = []
    for size_mib in sizes_mib:
        elements = int(size_mib * 2**20) // 4 // world * world
        for name, (call, correct) in collective_calls(rank, world, elements, device).items():
            for _ in range(warmup):
                call()
            synchronize(device)
            dist.barrier()
            started = time.perf_counter()
            for _ in range(iterations):
                call()
            synchronize(device)
            seconds = (time.perf_counter() - started) / iterations
            timings.append({"collective": name, "size_bytes": elements * 4, "seconds": seconds, "correct": correct()})
    return timings


@record  # a failing rank writes its exception to torchrun's error file; launch.py reads it
def main() -> None:
    die_with_parent()
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dist-backend", required=True)
    parser.add_argument("--device-type", required=True)
    parser.add_argument("--sizes-mib", type=lambda text: [float(size) for size in text.split(",")], default=None)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=5)
    args = parser.parse_args()

    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = device_for(args.device_type, local_rank)  # also registers the neuron process group
    dist.init_process_group(backend=args.dist_backend)
    try:
        record = {
            "rank": rank,
            "world_size": dist.get_world_size(),
            "local_rank": local_rank,
            "dist_backend": dist.get_backend(),
            "host": socket.gethostname(),
            **known_collectives(rank, world, device),
        }
        if args.sizes_mib:
            record["bandwidth"] = timed_collectives(rank, world, device, args.sizes_mib, args.warmup, args.iterations)
        if args.device_type == "cpu":
            from ...backends.cpu import measure_peak_flops

            dist.barrier()  # all ranks measure at once, sharing the cores as they do in training
            record["peak_flops"] = measure_peak_flops()
        write_json(args.out / f"rank-{rank}.json", record)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
