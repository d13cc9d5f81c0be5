"""Offline check of the trn2.48xlarge rank plan: does the real Qwen3 model fit under N-way FSDP?

One CPU process acts as one rank of an N-rank job via torch.distributed's "fake" backend (the
thing torchtitan's ``comm.mode = "fake_backend"`` does), builds the torchtitan model on the meta
device, and shards it with torchtitan's own ``parallelize_fn``, i.e. the FSDP2 call the trainer
makes. Nothing the size of the model is ever allocated.

    python -m qwen3_pilot.rank_plan --flavor 4B --world-size 64 --hbm-per-rank-gib 24 --out plan.json

Torch is imported inside functions only: the Snakefile imports package modules at parse time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .artifacts import write_json
from .paths import SCRIPTS

GIB = 1024**3
# AdamW keeps exp_avg and exp_avg_sq per parameter, in the parameter's dtype.
ADAMW_STATES_PER_PARAM = 2
# What the static figure leaves out; the headroom has to cover these.
NOT_COUNTED = (
    "activations, FSDP all-gather/reduce-scatter buffers (bf16 unsharded blocks), "
    "Neuron runtime and compiler reserve"
)


def _architecture(model_config) -> dict:
    layer = model_config.layers[0]
    attn = layer.attention
    ffn = getattr(layer, "feed_forward", None)
    return {
        "n_layers": len(model_config.layers),
        "dim": model_config.dim,
        "n_heads": attn.n_heads,
        "n_kv_heads": attn.n_kv_heads,
        "head_dim": attn.head_dim,
        # MoE flavors have no dense FFN.
        "ffn_hidden_dim": ffn.w1.out_features if ffn is not None else None,
        "vocab_size": model_config.vocab_size,
        "tied_embeddings": model_config.enable_weight_tying,
        "rope_theta": attn.rope.theta,
    }


def _local_numel(param, rank: int) -> int:
    """Numel of ``param``'s shard on global ``rank``, from its DTensor placements.

    The public ``compute_local_shape_and_global_offset`` only answers for the current rank;
    the private helper it wraps takes the mesh coordinate, so one process can answer for all
    ranks. ``build_plan`` checks it against the real local shard of the process's own rank.
    """
    import math

    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    mesh = param.device_mesh
    coordinate = (mesh.mesh == rank).nonzero()[0].tolist()
    shape, _ = _compute_local_shape_and_global_offset(
        param.shape, mesh.shape, coordinate, param.placements, skip_offset=True
    )
    return math.prod(shape)


def build_plan(flavor: str, world_size: int, hbm_per_rank_gib: float, rank: int = 0) -> dict:
    """Shard ``flavor`` over ``world_size`` fake ranks as ``rank`` and return the plan record.

    Initialises a process-global fake process group: call once per process (see
    ``run_plan_subprocess``).
    """
    from importlib.metadata import version
    from types import SimpleNamespace
    from unittest import mock

    import torch
    import torchtitan.distributed.parallel_dims as titan_parallel_dims
    from torch.distributed.tensor import DTensor
    from torchtitan.config import (
        TORCH_DTYPE_MAP,
        CompileConfig,
        ParallelismConfig,
        TrainingConfig,
    )
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.utils import init_fake_mode
    from torchtitan.models.qwen3 import model_registry
    from torchtitan.tools.utils import set_default_dtype

    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    started = time.perf_counter()
    init_fake_mode(world_size, "fake_backend", rank=rank)

    spec = model_registry(flavor)
    parallelism = ParallelismConfig(data_parallel_shard_degree=world_size)
    training = TrainingConfig()
    # The trainer hands its whole config here; Decoder.Config documents that any object with
    # a ``parallelism`` field will do. It attaches the sharding config the spmd_types path needs.
    spec.model.update_from_config(config=SimpleNamespace(parallelism=parallelism))

    parallel_dims = ParallelDims.from_config(parallelism, world_size)
    # torchtitan.tools.utils picks ``_get_available_device_type() or "cuda"`` at import, so on a
    # GPU-less box ParallelDims builds a "cuda" mesh and fully_shard then fails with
    # "RuntimeError: Found no NVIDIA driver on your system". The plan is device-agnostic: use cpu.
    with mock.patch.object(titan_parallel_dims, "device_type", "cpu"):
        parallel_dims.build_mesh()

    with torch.device("meta"), set_default_dtype(TORCH_DTYPE_MAP[training.dtype]):
        model = spec.model.build()
    total_params, _ = spec.model.get_nparams_and_flops(model, training.seq_len)

    model = spec.parallelize_fn(
        model,
        parallel_dims=parallel_dims,
        training=training,
        parallelism=parallelism,
        compile_config=CompileConfig(),
        ac_config=None,  # activation checkpointing changes activations, not parameters
        dump_folder="",  # only read by activation checkpointing
    )
    # spmd_types' distribute step gives tok_embeddings and lm_head separate DTensors (4B counts
    # 4,411,424,256 params until then); the trainer's init_weights re-ties them. On meta it
    # allocates nothing.
    with torch.no_grad():
        model.init_weights(buffer_device=None)

    params = list(model.parameters())  # de-duplicates the tied embedding
    unsharded = [name for name, p in model.named_parameters() if not isinstance(p, DTensor)]
    if unsharded:
        raise RuntimeError(f"parameters left unsharded by FSDP: {unsharded[:5]}")
    sharded_total = sum(p.numel() for p in params)
    if sharded_total != total_params:
        raise RuntimeError(
            f"sharded model holds {sharded_total:,} params, unsharded {total_params:,}: "
            "tied weights were split"
        )
    dtypes = {p.dtype for p in params}
    if len(dtypes) != 1:
        raise RuntimeError(f"mixed parameter dtypes {dtypes}; the byte count assumes one")
    (param_dtype,) = dtypes

    per_rank = [sum(_local_numel(p, r) for p in params) for r in range(world_size)]
    measured = sum(p.to_local().numel() for p in params)
    if measured != per_rank[rank]:
        raise RuntimeError(
            f"rank {rank}: real local shards hold {measured:,} params, "
            f"DTensor metadata says {per_rank[rank]:,}"
        )
    if sum(per_rank) != total_params:
        raise RuntimeError(f"shards sum to {sum(per_rank):,} params, not {total_params:,}")

    # FSDP2 parameters, their sharded grads and AdamW state all take the parameter's dtype
    # (reduce_dtype only governs the reduce-scatter itself).
    grad_dtype = optimizer_state_dtype = param_dtype
    bytes_per_param = (
        param_dtype.itemsize
        + grad_dtype.itemsize
        + ADAMW_STATES_PER_PARAM * optimizer_state_dtype.itemsize
    )
    # Rank 0 always holds full dim-0 chunks (later ranks may hold less) and FSDP2 pads every
    # rank's storage to that size, so the verdict uses the max over ranks.
    max_params = max(per_rank)
    static_bytes = max_params * bytes_per_param
    static_gib = static_bytes / GIB
    checked = sorted({0, rank, world_size - 1})
    return {
        "flavor": flavor,
        "world_size": world_size,
        "fsdp_degree": parallel_dims.dp_shard,
        "comm_mode": "fake_backend",
        "spmd_backend": parallelism.spmd_backend,
        "process_rank": rank,
        "architecture": _architecture(spec.model),
        "total_params": total_params,
        "params_per_rank": {str(r): per_rank[r] for r in checked},
        "params_per_rank_max": max_params,
        "params_per_rank_min": min(per_rank),
        "param_dtype": str(param_dtype).removeprefix("torch."),
        "grad_dtype": str(grad_dtype).removeprefix("torch."),
        "optimizer": "AdamW",
        "optimizer_states_per_param": ADAMW_STATES_PER_PARAM,
        "optimizer_state_dtype": str(optimizer_state_dtype).removeprefix("torch."),
        "bytes_per_param": bytes_per_param,
        "static_bytes_per_rank": static_bytes,
        "static_gib_per_rank": static_gib,
        "static_excludes": NOT_COUNTED,
        **held_to_budget(static_gib, hbm_per_rank_gib),
        "versions": {"torch": torch.__version__, "torchtitan": version("torchtitan")},
        "elapsed_s": round(time.perf_counter() - started, 2),
    }


def held_to_budget(static_gib_per_rank: float, hbm_per_rank_gib: float) -> dict:
    """The static state per rank against the HBM budget per rank: the headroom left and whether it fits."""
    return {"hbm_per_rank_gib": hbm_per_rank_gib, "headroom_gib": hbm_per_rank_gib - static_gib_per_rank,
            "fits": static_gib_per_rank <= hbm_per_rank_gib}


def run_plan_subprocess(
    flavor: str,
    world_size: int,
    hbm_per_rank_gib: float,
    out_path: str | os.PathLike,
    python: str = sys.executable,
    *,
    rank: int = 0,
) -> dict:
    """Run the CLI in a fresh interpreter (the fake process group is process-global)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SCRIPTS), env.get("PYTHONPATH")]))
    cmd = [
        python, "-m", "qwen3_pilot.rank_plan",
        "--flavor", flavor,
        "--world-size", str(world_size),
        "--hbm-per-rank-gib", str(hbm_per_rank_gib),
        "--rank", str(rank),
        "--out", str(out_path),
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-20:])
        raise RuntimeError(f"rank plan failed (exit {proc.returncode}): {tail}")
    return json.loads(Path(out_path).read_text())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flavor", default="4B", help="torchtitan qwen3 flavor")
    parser.add_argument("--world-size", type=int, default=64)
    parser.add_argument("--hbm-per-rank-gib", type=float, default=24.0)
    parser.add_argument("--rank", type=int, default=0, help="rank this process plays")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    plan = build_plan(args.flavor, args.world_size, args.hbm_per_rank_gib, rank=args.rank)
    # Written even when it does not fit, so the figures can be read; Snakemake removes the
    # outputs of a failed job anyway.
    write_json(args.out, plan)
    summary = (
        f"Qwen3-{args.flavor} on {args.world_size} ranks: "
        f"{plan['params_per_rank_max']:,} params/rank, "
        f"{plan['static_gib_per_rank']:.3f} GiB static per rank "
        f"({plan['bytes_per_param']} B/param) vs {args.hbm_per_rank_gib:g} GiB HBM per rank"
    )
    if not plan["fits"]:
        sys.exit(f"DOES NOT FIT: {summary}")
    print(f"fits: {summary}, headroom {plan['headroom_gib']:.2f} GiB")


if __name__ == "__main__":
    main()
