"""One rank of `verify_ranks`, started by torchrun: joins the process group, runs two collectives with
known results and writes what it saw to <out>/rank-<rank>.json."""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path

from .artifacts import write_json


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dist-backend", required=True)
    parser.add_argument("--device-type", required=True)
    args = parser.parse_args()

    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(args.device_type, local_rank) if args.device_type != "cpu" else torch.device("cpu")
    if args.device_type == "neuron":
        import torch_neuronx  # noqa: F401  (registers the neuron device and process group)
    dist.init_process_group(backend=args.dist_backend)
    try:
        summed = torch.tensor([float(rank + 1)], device=device)
        dist.all_reduce(summed, op=dist.ReduceOp.SUM)
        gathered = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
        dist.all_gather(gathered, torch.tensor([rank], dtype=torch.int64, device=device))
        record = {
            "rank": rank,
            "world_size": dist.get_world_size(),
            "local_rank": local_rank,
            "device": str(summed.device),
            "dist_backend": dist.get_backend(),
            "host": socket.gethostname(),
            "all_reduce_sum": summed.item(),
            "all_gather": [int(t.item()) for t in gathered],
        }
        if args.device_type == "cpu":
            from .backends.cpu import measure_peak_flops

            dist.barrier()  # all ranks measure at once, sharing the cores as they do in training
            record["peak_flops"] = measure_peak_flops()
        write_json(args.out / f"rank-{rank}.json", record)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
