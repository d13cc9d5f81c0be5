"""The neuron backend: trn2.48xlarge, 16 Trainium2 chips x 8 physical NeuronCores, LNC=2 -> 64 ranks.

It cannot execute on the build machines (AWS's packages come only from AWS's repository), so everything
here is plain functions that tests call with injected readers; execution is claimed only on a trn2.
"""

from __future__ import annotations

import glob
import json
import shutil
import subprocess
from typing import Any, Callable

from ..config import expected_neuron_ranks
from . import Backend, cache_env

# Debian packages of the Neuron driver, runtime and collectives, as the DLAMI installs them.
NEURON_SYSTEM_PACKAGES = ("aws-neuronx-dkms", "aws-neuronx-runtime-lib", "aws-neuronx-collectives")
DEVICE_GLOB = "/dev/neuron[0-9]*"
# Dense BF16 peak that torchtitan uses for MFU on trn2: 158 TFLOPS per logical core at LNC=2, i.e. per
# pair of physical cores; at LNC=1 a rank is one physical core, half of that.
TRN2_BF16_PEAK_FLOPS_PER_PHYSICAL_CORE = 158e12 / 2


def peak_flops_per_rank(lnc: int) -> float:
    return TRN2_BF16_PEAK_FLOPS_PER_PHYSICAL_CORE * lnc


def launcher_env(config: dict[str, Any], cache_root: str) -> dict[str, str]:
    lnc = str(config["neuron"]["lnc"])
    return {
        **cache_env(cache_root),
        # Runtimes from 2.20 read NEURON_LOGICAL_NC_CONFIG; older ones NEURON_RT_VIRTUAL_CORE_SIZE.
        "NEURON_LOGICAL_NC_CONFIG": lnc,
        "NEURON_RT_VIRTUAL_CORE_SIZE": lnc,
        # Compiled graphs are cached per project so that a rerun does not recompile.
        "NEURON_COMPILE_CACHE_URL": f"{cache_root}/neuron-compile-cache",
        "NEURON_CC_FLAGS": f"--cache_dir={cache_root}/neuron-compile-cache",
    }


def unavailable_reason(device_paths: list[str], expected_chips: int) -> str | None:
    if not device_paths:
        return "no Neuron devices (/dev/neuron*) on this machine: the neuron backend needs a trn2 instance"
    if len(device_paths) != expected_chips:
        return f"found {len(device_paths)} Neuron devices, expected {expected_chips} (neuron.chips)"
    return None


def read_system_versions(run: Callable[[list[str]], str] | None = None) -> dict[str, Any]:
    """Driver, runtime, collectives and compiler versions, or 'not found' for each one missing."""
    run = run or _run
    versions: dict[str, Any] = {}
    for package in NEURON_SYSTEM_PACKAGES:
        versions[package] = run(["dpkg-query", "-W", "-f=${Version}", package]) or "not found"
    compiler = run(["neuronx-cc", "--version"]).strip().splitlines()
    versions["neuronx-cc"] = compiler[-1] if compiler else "not found"
    neuron_ls = run(["neuron-ls", "--json-output"])
    try:
        devices = json.loads(neuron_ls) if neuron_ls else []
    except json.JSONDecodeError:
        devices = []
    versions["neuron_ls_devices"] = len(devices)
    return versions


def _run(command: list[str]) -> str:
    if shutil.which(command[0]) is None:
        return ""
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return result.stdout.strip() if result.returncode == 0 else ""


def make_backend(config: dict[str, Any], cache_root: str) -> Backend:
    neuron = config["neuron"]
    return Backend(
        name="neuron",
        device_type="neuron",
        dist_backend="neuron",
        expected_ranks=expected_neuron_ranks(neuron),
        launcher_env=launcher_env(config, cache_root),
        unavailable_reason=unavailable_reason(sorted(glob.glob(DEVICE_GLOB)), neuron["chips"]),
        system_versions=read_system_versions,
        device_for_local_rank=lambda local_rank: f"neuron:{local_rank}",
        peak_flops_per_rank=peak_flops_per_rank(neuron["lnc"]),
        peak_flops_source=(
            f"trn2 dense BF16 peak, 158 TFLOPS per logical core at LNC=2 (torchtitan's figure), "
            f"at LNC={neuron['lnc']}: {peak_flops_per_rank(neuron['lnc']) / 1e12:g} TFLOPS per rank"
        ),
    )


def prepare_torchtitan() -> list[str]:
    """Nothing to patch: torchtitan-neuron (release-2.33) brings its own device, process group and
    memory handling for the neuron device."""
    return []
