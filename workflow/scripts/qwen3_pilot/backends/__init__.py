"""One module per backend, each exposing `make_backend(config) -> Backend`.

The stages only talk to the `Backend` interface; everything backend-specific (device, process group,
launcher environment, topology, system versions) lives in that backend's module.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from typing import Any, Callable

BACKENDS = ("cpu", "neuron")


@dataclass(frozen=True)
class Backend:
    name: str
    device_type: str
    dist_backend: str
    expected_ranks: int
    # Environment for every launched process (caches under the project, thread counts, runtime knobs).
    launcher_env: dict[str, str]
    # Why this machine can or cannot execute the backend; None means it can.
    unavailable_reason: str | None
    # Versions outside pip's view (driver, runtime, compiler), read by the backend itself.
    system_versions: Callable[[], dict[str, Any]] = field(default=lambda: {})
    # The device a rank uses, from its local rank.
    device_for_local_rank: Callable[[int], str] = field(default=lambda local_rank: "cpu")
    # Peak FLOPS per rank that MFU is measured against; None: measured on the ranks by verify_ranks.
    peak_flops_per_rank: float | None = None
    # Where that peak comes from, in words, for the report.
    peak_flops_source: str = ""

    def torchrun_command(self, python: str, nproc: int, module: str, args: list[str]) -> list[str]:
        return [
            python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", module, *args,
        ]


def backend_module(name: str):
    if name not in BACKENDS:
        raise ValueError(f"backend = {name!r}: allowed: {', '.join(BACKENDS)}")
    return importlib.import_module(f"{__name__}.{name}")


def make_backend(config: dict[str, Any], cache_root: str) -> Backend:
    return backend_module(config["backend"]).make_backend(config, cache_root)


# Compiler caches that importing torch._dynamo (torchtitan does) would otherwise create in the system temp folder.
COMPILER_CACHE_KEYS = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "MPLCONFIGDIR")


def keep_compiler_caches_in_project(cache_root: str) -> None:
    """For a stage's own process (torchrun's ranks get the whole cache_env from the launcher)."""
    for key in COMPILER_CACHE_KEYS:
        os.environ.setdefault(key, cache_env(cache_root)[key])


def cache_env(cache_root: str) -> dict[str, str]:
    """Keeps every library cache under the project instead of ~/.cache and the system temp folder."""
    return {
        "HF_HOME": f"{cache_root}/huggingface",
        "HF_DATASETS_CACHE": f"{cache_root}/huggingface/datasets",
        "TORCHINDUCTOR_CACHE_DIR": f"{cache_root}/torchinductor",
        "TRITON_CACHE_DIR": f"{cache_root}/triton",
        "TMPDIR": f"{cache_root}/tmp",
        "MPLCONFIGDIR": f"{cache_root}/matplotlib",
    }
