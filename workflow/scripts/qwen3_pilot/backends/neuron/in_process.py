"""In every process that uses the neuron device: torch-neuronx imported first, torchtitan prepared for the device
(its memory monitor synchronized), and the NKI kernels installed where a recipe replaces modules."""

from __future__ import annotations

import logging
import os
from typing import Any

from ...problems import problem_list
from .machine import GIB

log = logging.getLogger(__name__)

# TorchNeuron's compile caches (DESIGN.md): compiled NEFFs, and the debug folder whose default is
# /tmp/neuron_backend. NEURON_COMPILE_CACHE_URL and NEURON_CC_FLAGS=--cache_dir are the older torch-xla
# path's, and --cache_dir is no neuronx-cc option; a user's NEURON_CC_FLAGS is kept, with the LNC added.
COMPILE_CACHE_DIRS = {"TORCH_NEURONX_NEFF_CACHE_DIR": "neff-cache", "TORCH_NEURONX_DEBUG_DIR": "debug"}
# TorchNeuron's local folder for the compile cache's lock files, /tmp/local_cache unless this is set (the
# torch-neuronx source: CompilationCache's constructor in CompilationCache.cpp, which includes
# torch_neuronx/csrc/core/cache/CacheUtils.h: "Initialize local cache directory for lock files"; and its
# Python cache utilities' get_local_cache_dir; read through the search index, which names no repository).
# One folder for the project, not one per measurement: a measurement's copied cache must carry no locks.
LOCAL_CACHE_DIRS = {"TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR": "neff-local-cache"}


def import_torch_neuronx() -> None:
    """`import torch_neuronx` registers the `neuron` device, process-group backend and compile backend;
    before it, torch.device("neuron", n) raises "Expected one of cpu, cuda, ... device type". Also makes
    the compile cache folders the launcher named, in case the compiler does not create them."""
    for key in COMPILE_CACHE_DIRS:
        if os.environ.get(key):
            os.makedirs(os.environ[key], exist_ok=True)
    try:
        import torch_neuronx  # noqa: F401
    except ImportError as error:
        raise ImportError(
            f"the neuron backend needs torch_neuronx (torch-neuronx from AWS's Neuron repository, "
            f"workflow/envs/neuron.txt): {error}"
        ) from error


def prepare_torchtitan() -> list[str]:
    """Imports torch_neuronx before torchtitan builds anything (torchtitan's tools.utils picks the device
    type at import), then makes the memory monitor read its peaks after a synchronize. The rest comes with
    torchtitan-neuron (release-2.33): its device, process group and memory handling for the neuron device.
    Returns the names of what it changed in torchtitan."""
    import_torch_neuronx()
    import torchtitan.components.metrics as tt_metrics

    # torchtitan's DeviceMemoryMonitor reads device_module.memory_stats as it is: on neuron the device runs
    # the queued graphs asynchronously, so the figures could miss the step's own peak; and it reads CUDA's
    # flat keys with a default of -1 byte, which TorchNeuron's nested stats lack (a "-0.00 GiB" peak).
    # Whatever monitor the installed torchtitan builds is kept for the rest; the peaks are read here, after
    # the device has finished its work, from the keys TorchNeuron gives.
    build = tt_metrics.build_device_memory_monitor
    tt_metrics.build_device_memory_monitor = lambda: SynchronizedMemoryMonitor(
        build(), tt_metrics.device_module, tt_metrics.DeviceMemStats)
    return ["memory_monitor_synchronize"]


# The figures torchtitan's DeviceMemStats holds, as TorchNeuron's torch.neuron.memory_stats() gives them:
# a dict with "active_bytes" and "reserved_bytes" each holding "current" and "peak", and the counters
# "num_alloc_retries" and "num_ooms" (the torch-neuronx source: torch.neuron's memory_stats returns
# torch_neuronx.memory_stats(device), whose integration tests check exactly these keys and sub-keys). CUDA's
# flat spelling ("active_bytes.all.peak") is read too, should an allocator give that one. Call
# torch.neuron.synchronize() first (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/guides/
# memory-profiling-guide.html: the Neuron allocator is asynchronous).
PEAK_MEMORY_KEYS = (("active_bytes", "peak"), ("reserved_bytes", "peak"))
MEMORY_COUNTER_KEYS = ("num_alloc_retries", "num_ooms")


def memory_stat(stats: dict[str, Any], key: str, sub_key: str | None = None) -> int:
    """One figure of a device's memory stats; a missing one raises, naming it and the keys that were there,
    instead of becoming a figure."""
    value = stats.get(key)
    if sub_key is not None:
        value = value.get(sub_key) if isinstance(value, dict) else stats.get(f"{key}.all.{sub_key}")
    if not isinstance(value, int):
        wanted = repr(key) if sub_key is None else f"{key!r} -> {sub_key!r} (or {f'{key}.all.{sub_key}'!r})"
        raise KeyError(f"torch.neuron.memory_stats() has no {wanted}; its keys: {', '.join(sorted(stats)) or 'none'}")
    return value


class SynchronizedMemoryMonitor:
    """torchtitan's device memory monitor whose peak figures are read after `device_module.synchronize()`,
    from TorchNeuron's memory stats (`memory_stat`): the device allocator's figures once every queued
    operation has run. Everything else is the monitor's."""

    def __init__(self, monitor, device_module, stats_type):
        self.monitor, self.device_module, self.stats_type = monitor, device_module, stats_type

    def get_peak_stats(self):
        self.device_module.synchronize()
        stats = self.device_module.memory_stats(self.monitor.device)
        active, reserved = (memory_stat(stats, key, sub_key) for key, sub_key in PEAK_MEMORY_KEYS)
        retries, ooms = (memory_stat(stats, key) for key in MEMORY_COUNTER_KEYS)
        if retries or ooms:
            log.warning("neuron memory: %d allocation retries, %d out-of-memory errors", retries, ooms)
        capacity = self.monitor.device_capacity
        return self.stats_type(active / GIB, 100 * active / capacity, reserved / GIB, 100 * reserved / capacity,
                               retries, ooms)

    def __getattr__(self, name):  # device_name, device_capacity_gib, reset_peak_stats ...
        return getattr(self.monitor, name)


# nki-library has no kernel with the grouped experts' contract (tokens sorted by expert, w1/w3 [E, F, D],
# w2 [E, D, F], per-expert counts): its training MoE kernels are blockwise (blockwise_mm_*, with gate_up
# [E, H, 2, I] and down [E, I, H] weights plus routing maps). So the experts run torch._grouped_mm on the
# device, which TorchNeuron supports, and the stages say so.
NEURON_EXPERTS_IMPLEMENTATION = (
    "torch._grouped_mm on the neuron device (no nki-library kernel fits the grouped-experts contract: its "
    "blockwise_mm_* kernels take gate_up [E, H, 2, I] weights and routing maps)"
)
NKI_ROPE_MODULE = "nkilib.core.embeddings.rope_hf"


# The runtime's LNC, which device_process_env sets in every process that uses the device (a rank, or
# kernel_numerics' own process): the kernel's launch grid must be the logical cores the runtime gives a rank.
RUNTIME_LNC_VAR = "NEURON_LOGICAL_NC_CONFIG"


def runtime_lnc(environ: dict[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    value = environ.get(RUNTIME_LNC_VAR, "")
    if not value.isdigit():
        raise RuntimeError(f"{RUNTIME_LNC_VAR}={value!r}: the neuron kernels launch on the runtime's logical cores, "
                           "and the backend's launch sets this variable (device_process_env); a process that uses "
                           "the device without it cannot size the kernel's grid")
    return int(value)


def install_kernels(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Routes the kernels to their neuron implementations in this process (rope_hf: the NKI Library kernel
    launched on the runtime's logical cores) and returns which implementation runs per kernel. Fails at once,
    naming every missing package, where the Neuron packages are not installed."""
    import importlib

    from ...titan.kernels import KERNELS, implementation, set_implementation

    missing = []
    for module, package in (("torch_neuronx", "torch-neuronx"), (NKI_ROPE_MODULE, "the NKI Library, module nkilib")):
        try:
            if module == "torch_neuronx":
                import_torch_neuronx()
            else:
                importlib.import_module(module)
        except ImportError as error:
            missing.append(f"{module} ({package}, from AWS's Neuron repository, workflow/envs/neuron.txt): {error}")
    if missing:
        raise ImportError(problem_list("the neuron kernels cannot be installed; missing", missing))
    from .nki_rope import register_neuron_kernel

    lnc = runtime_lnc(environ)
    register_neuron_kernel(lnc)
    set_implementation("rope_hf", f"NKI: {NKI_ROPE_MODULE}.rope_hf[{lnc}] on {lnc} logical core(s) per rank, "
                                  "registered with torch_neuronx.nki_op")
    set_implementation("moe_grouped_experts", NEURON_EXPERTS_IMPLEMENTATION)
    return {kernel: implementation(kernel) for kernel in KERNELS}
