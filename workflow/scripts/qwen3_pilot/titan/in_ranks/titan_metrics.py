"""torchtitan's MetricsProcessor with a JSON-lines logger and the backend's MFU peak.

Each logged step becomes one line of <dump_folder>/metrics.jsonl with torchtitan's own metric names
(loss_metrics/global_avg_loss, grad_norm, throughput(tps), tflops, mfu(%), memory/max_active(GiB),
time_metrics/end_to_end(s) ...), written by rank 0 and flushed per step.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from typing import Any

from torchtitan.components.metrics import BaseLogger, LoggerContainer, MetricsProcessor

from ...trainer_run import METRICS_FILE


class JsonlLogger(BaseLogger):
    def __init__(self, path: str):
        self.handle = open(path, "a", buffering=1)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        # Wall-clock time of the record: the benchmark's time to step 1 is this minus the launch's start.
        record: dict[str, Any] = {"step": step, "logged_at": time.time()}
        for key, value in metrics.items():
            number = float(value) if hasattr(value, "__float__") else value
            # JSON has no NaN/inf: keep them visible as strings so the stage can name the step.
            record[key] = repr(number) if isinstance(number, float) and not math.isfinite(number) else number
        self.handle.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self.handle.close()


class JsonlMetricsProcessor(MetricsProcessor):
    @dataclass(kw_only=True, slots=True)
    class Config(MetricsProcessor.Config):
        peak_flops: float = 0.0
        """Peak FLOPS per rank for MFU; 0 keeps torchtitan's get_peak_flops(device name)."""

    def __init__(self, config: Config, *, dump_folder: str = "./outputs", **kwargs):
        super().__init__(config, dump_folder=dump_folder, **kwargs)
        if config.peak_flops > 0:
            self.gpu_peak_flops = config.peak_flops
        if int(os.environ.get("RANK", "0")) == 0:
            os.makedirs(dump_folder, exist_ok=True)
            if not isinstance(self.logger, LoggerContainer):
                container = LoggerContainer()
                container.add_logger(self.logger)
                self.logger = container
            self.logger.add_logger(JsonlLogger(os.path.join(dump_folder, METRICS_FILE)))



def recording_router_load(post_optimizer_build_fn, path: str):
    """Wraps a ModelSpec's post_optimizer_build_fn: before torchtitan's load-balancing hook reads and
    zeroes each MoE layer's `tokens_per_expert_E` in the optimizer's step pre-hook, sum it over all ranks
    and let rank 0 append one line per step: {"step": n, "tokens_per_expert": [[per expert] per layer]}."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl

    from ...backends import collective_count_dtype

    def build(optimizers, model_parts, parallel_dims):
        steps = {"seen": 0}

        def record(*_args, **_kwargs):
            counts, balancing = [], []
            for part in model_parts:
                for block in part.get_submodule("layers").values():
                    if getattr(block, "moe_enabled", False):
                        local = block.moe.tokens_per_expert_E
                        local = local.to_local() if hasattr(local, "to_local") else local
                        # Activation checkpointing reruns the forward, counting every token twice; torchtitan's
                        # own hook halves the counts in the same case.
                        if getattr(block, "checkpoint_impl", None) is CheckpointImpl.NO_REENTRANT:
                            local = local // 2
                        counts.append(local)
                        balancing.append(block.moe)
            if not counts:
                return
            # Whole numbers (float32 in torchtitan): int32 holds them exactly, and Neuron's collectives take
            # no 64-bit types.
            by_layer = torch.vstack(counts).detach().to(collective_count_dtype())
            if dist.is_initialized():
                dist.all_reduce(by_layer)  # tp = ep = 1: every rank routed its own tokens
            steps["seen"] += 1
            for moe in balancing:
                if moe.load_balance_coeff is None:  # no torchtitan hook zeroes the counts then
                    moe.tokens_per_expert_E.zero_()
            if int(os.environ.get("RANK", "0")) == 0:
                with open(path, "a") as handle:
                    handle.write(json.dumps({"step": steps["seen"], "tokens_per_expert": by_layer.tolist()}) + "\n")

        optimizers.register_step_pre_hook(record)
        if post_optimizer_build_fn is not None:
            post_optimizer_build_fn(optimizers, model_parts, parallel_dims)

    return build
