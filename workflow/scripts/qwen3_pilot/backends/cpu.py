"""The cpu backend: any Linux box, gloo process group, one OS process per rank.

Every CPU workaround for torchtitan lives here, each with the failure it avoids. They are applied in the
trainer processes only (`prepare_torchtitan`), before torchtitan builds anything; tests switch single
workarounds off with QWEN3_PILOT_SKIP_CPU_WORKAROUNDS=name,... to show the failure each one avoids.
"""

from __future__ import annotations

import logging
import os
import resource
import time
from typing import Any

from . import Backend, cache_env, multi_node_launch, thread_caps

log = logging.getLogger(__name__)

SKIP_ENV = "QWEN3_PILOT_SKIP_CPU_WORKAROUNDS"
WORKAROUNDS = ("device", "memory", "barrier", "fsdp_sum")

# The report's title on this backend: a CPU run is a rehearsal, and its page says so before anything else.
REPORT_TITLE = "Qwen3 pilot, CPU rehearsal: audit trail (tiny stand-in models, no Trainium figure)"


def report_caveat(figures: dict[str, dict[str, Any]]) -> str:
    """The report's first line on this backend, with the stand-ins' sizes as the run measured them (`figures`:
    each stage's recorded figures)."""

    def size(stage: str, key: str) -> str:
        count = figures.get(stage, {}).get(key)
        return f"{count:,} parameters" if isinstance(count, int) else f"size not recorded ({stage} has no figure)"

    return ("CPU rehearsal: tiny stand-in models with the real architectures (dense Qwen3 "
            f"{size('fetch_weights', 'parameters_stored')}; reduced MoE {size('moe_reduced', 'parameters')}) on "
            "gloo ranks. It proves that the workflow, the recipes and every check run end to end; no figure on this "
            "page is a Trainium figure, and none says how Qwen3-4B trains on a trn2.")


def make_backend(config: dict[str, Any], cache_root: str) -> Backend:
    ranks = config["ranks"]
    env = {**cache_env(cache_root), **thread_caps(ranks)}
    multi_node = multi_node_launch(config)
    return Backend(
        name="cpu",
        device_type="cpu",
        dist_backend="gloo",
        ranks_per_node=ranks,
        expected_ranks=ranks * config["nodes"],
        launcher_env=env,
        unavailable_reason=multi_node.problem if multi_node else None,
        multi_node=multi_node,
        peak_flops_source=(
            "measured: float32 matmul throughput of one rank with its OMP_NUM_THREADS threads, taken in "
            "verify_ranks (the slowest rank); a CPU has no published dense peak that torchtitan knows"
        ),
    )


def measure_peak_flops(size: int = 512, seconds: float = 0.5) -> float:
    """Float32 matmul FLOPS of this process: the CPU peak that MFU is measured against."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)  # warm-up: thread pool start, first-call dispatch
    calls, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        torch.mm(a, b)
        calls += 1
    return 2 * size**3 * calls / elapsed


def _enabled(name: str, applied: list[str]) -> bool:
    skipped = {s for s in os.environ.get(SKIP_ENV, "").split(",") if s}
    if name in skipped:
        log.warning("cpu workaround %s skipped (%s)", name, SKIP_ENV)
        return False
    applied.append(name)
    return True


def prepare_torchtitan() -> list[str]:
    """Applies the workarounds; must run before any torchtitan module but tools.utils is imported,
    because metrics, distributed.utils and parallel_dims bind `device_type`/`device_module` at import."""
    import torch

    applied: list[str] = []
    import torchtitan.tools.utils as tt_utils

    # tools.utils takes device_type = _get_available_device_type() or "cuda": on a CPU machine with
    # torch's CUDA wheel the Trainer then calls torch.cuda.set_device and fails with
    # "RuntimeError: Found no NVIDIA driver on your system".
    if _enabled("device", applied):
        tt_utils.device_type, tt_utils.device_module = "cpu", torch.cpu

    # The device memory monitor calls get_device_name, memory_stats, reset_peak_memory_stats ... that
    # torch.cpu lacks: "AttributeError: module 'torch.cpu' has no attribute 'get_device_name'".
    # The replacement reports the process's peak RSS against the machine's memory.
    if _enabled("memory", applied):
        import torchtitan.components.metrics as tt_metrics

        tt_metrics.build_device_memory_monitor = lambda: _PeakRssMonitor(tt_metrics.DeviceMemStats)

    # set_pg_timeouts calls barrier(device_ids=[device_module.current_device()]); torch.cpu returns the
    # string "cpu" and gloo's barrier rejects device ids: "TypeError: ... BarrierOptions ... ['cpu']".
    if _enabled("barrier", applied):
        import torchtitan.distributed.utils as dist_utils

        def set_pg_timeouts(timeout, parallel_dims):
            torch.distributed.barrier()
            groups = [mesh.get_group() for mesh in parallel_dims.get_all_one_dimensional_meshes().values()]
            for group in [*groups, None]:
                torch.distributed.set_timeout(timeout, group)

        dist_utils.set_pg_timeouts = set_pg_timeouts

    # torchtitan sets a gradient divide factor of 1.0 on every FSDP module, so FSDP reduce-scatters with
    # ReduceOp.PREMUL_SUM, which gloo lacks: "RuntimeError: Cannot use ReduceOp.PREMUL_SUM with Gloo".
    # A plain SUM with the factor 1.0 gives the same result.
    if _enabled("fsdp_sum", applied):
        from torch.distributed.fsdp import FSDPModule

        set_factor = FSDPModule.set_gradient_divide_factor

        def set_gradient_divide_factor(self, factor):
            set_factor(self, factor)
            self.set_force_sum_reduction_for_comms(True)

        FSDPModule.set_gradient_divide_factor = set_gradient_divide_factor

    return applied


class _PeakRssMonitor:
    def __init__(self, stats_type):
        self.stats_type = stats_type
        self.device_name = "cpu"
        with open("/proc/meminfo") as meminfo:
            self.device_capacity = int(meminfo.readline().split()[1]) * 1024
        self.device_capacity_gib = self.device_capacity / 2**30

    def get_peak_stats(self):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        gib, pct = peak / 2**30, 100 * peak / self.device_capacity
        return self.stats_type(gib, pct, gib, pct, 0, 0)

    def reset_peak_stats(self):
        pass  # ru_maxrss cannot be reset: the figure is the peak since the process started


def install_kernels() -> dict[str, str]:
    """The cpu implementation of every kernel is the PyTorch one each kernel module registers itself
    (`qwen3_pilot::rope_hf`'s composite, `torch._grouped_mm`): nothing to install. Returns which runs."""
    from ..titan.kernels import KERNELS, implementation

    return {kernel: implementation(kernel) for kernel in KERNELS}


def kernel_limits(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The PyTorch implementations take every shape their op's contract allows: no kernel rule of their own."""
    return {}


def config_problems(config: dict[str, Any]) -> list[str]:
    """The cpu backend takes every configuration the schema and the shared rules allow."""
    return []
