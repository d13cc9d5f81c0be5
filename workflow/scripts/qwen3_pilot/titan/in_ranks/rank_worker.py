"""One rank of `verify_ranks`, started by torchrun: joins the process group, runs two collectives with
known results and writes what it saw to <out>/rank-<rank>.json."""

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
        from ...backends.neuron import import_torch_neuronx

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


@record  # a failing rank writes its exception to torchrun's error file; launch.py reads it
def main() -> None:
    die_with_parent()
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dist-backend", required=True)
    parser.add_argument("--device-type", required=True)
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
        if args.device_type == "cpu":
            from ...backends.cpu import measure_peak_flops

            dist.barrier()  # all ranks measure at once, sharing the cores as they do in training
            record["peak_flops"] = measure_peak_flops()
        write_json(args.out / f"rank-{rank}.json", record)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
