"""One module per backend (`cpu.py`, the `neuron/` package), each the `BackendModule` below: `make_backend(config)
-> Backend` for the stages, and the few functions other processes call on it by name (the trainer's ranks, the
report, the parse-time config check).

The stages only talk to these; everything backend-specific (device, process group, launcher environment, topology,
system versions, kernels and the rules they enforce, config rules) lives in that backend's module.
"""

from __future__ import annotations

import importlib
import os
import subprocess
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

BACKENDS = ("cpu", "neuron")
# The config keys a backend is built from: the rules pass only these (other edits leave the stages cached).
BACKEND_CONFIG_KEYS = ("backend", "ranks", "neuron", "nodes", "multi_node")
# Where the rendezvous host goes when it is only known inside the SLURM allocation (preflight, dry run).
FIRST_NODE_OF_ALLOCATION = "<first node of the SLURM allocation>"


@dataclass(frozen=True)
class MultiNode:
    """One launch over `nodes` instances (torchtitan's multinode_trainer.slurm is the model): `launcher`
    starts the same torchrun once on every node, and every node's agent meets the others at the c10d
    rendezvous store on `endpoint`; torchrun then numbers the ranks 0 .. nodes x ranks per node - 1."""

    nodes: int
    launcher: tuple[str, ...]
    endpoint: str
    # The same on every node: the SLURM job id inside an allocation.
    rdzv_id: str
    # Why this process cannot launch across the nodes (not inside an allocation of `nodes` nodes, no
    # rendezvous host); None when it can. The commands are still built, for the preflight and dry runs.
    problem: str | None = None

    def torchrun_options(self) -> list[str]:
        return [f"--nnodes={self.nodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={self.endpoint}",
                f"--rdzv-id={self.rdzv_id}"]


def slurm_hostnames(nodelist: str) -> list[str]:
    """SLURM's compressed node list (e.g. trn2-[1-2]) expanded by SLURM itself."""
    result = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return result.stdout.split()


def multi_node_launch(
    config: dict[str, Any], environ: Mapping[str, str] = os.environ,
    hostnames: Callable[[str], list[str]] = slurm_hostnames,
) -> MultiNode | None:
    """config `nodes` and `multi_node` read against this process's SLURM allocation; None on one node."""
    nodes, settings = config["nodes"], config["multi_node"]
    if nodes == 1:
        return None
    problem = None
    allocated = environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES")
    if allocated is not None and int(allocated) != nodes:
        problem = (f"nodes = {nodes}, but this SLURM allocation has {allocated} node(s) "
                   "(SLURM_JOB_NUM_NODES); torchrun's --nnodes must match the nodes srun starts it on")
    host = settings["rdzv_host"]
    if host is None:
        nodelist = environ.get("SLURM_JOB_NODELIST")
        if nodelist:
            host = hostnames(nodelist)[0]
        else:
            host = FIRST_NODE_OF_ALLOCATION
            problem = problem or (
                f"nodes = {nodes} and multi_node.rdzv_host = null: the rendezvous host is the first node of the "
                "SLURM allocation, and this process is not in one (SLURM_JOB_NODELIST is unset); run through "
                "the SLURM profile (profiles/slurm) or set multi_node.rdzv_host"
            )
    return MultiNode(
        nodes=nodes, launcher=tuple(settings["launcher"]), endpoint=f"{host}:{settings['rdzv_port']}",
        rdzv_id=environ.get("SLURM_JOB_ID", "qwen3-pilot"), problem=problem,
    )


@dataclass(frozen=True)
class Backend:
    name: str
    device_type: str
    dist_backend: str
    # Ranks on each instance (torchrun's --nproc-per-node) and in all (the world size: x nodes).
    ranks_per_node: int
    expected_ranks: int
    # Environment for every launched process (caches under the project, thread counts, runtime knobs).
    launcher_env: dict[str, str]
    # Why this machine can or cannot execute the backend (no devices; a multi-node launch outside an
    # allocation of that many nodes); None means it can.
    unavailable_reason: str | None
    # Versions outside pip's view (driver, runtime, compiler), read by the backend itself.
    system_versions: Callable[[], dict[str, Any]] = field(default=lambda: {})
    # The device a rank uses, from its local rank.
    device_for_local_rank: Callable[[int], str] = field(default=lambda local_rank: "cpu")
    # Peak FLOPS per rank that MFU is measured against; None: measured on the ranks by verify_ranks.
    peak_flops_per_rank: float | None = None
    # Where that peak comes from, in words, for the report.
    peak_flops_source: str = ""
    # Local ranks whose output also reaches the launcher's console (the stage log) when every rank writes
    # its own log files; None: every rank's. On neuron 64 ranks interleaved in one log cannot be read.
    console_local_ranks: tuple[int, ...] | None = None
    # The machine's devices against the config, for verify_ranks: (figures, problems); None: nothing to check.
    topology: Callable[[], tuple[dict[str, Any], list[str]]] | None = None
    # torch.compile on this backend: torchtitan's --compile.backend, and the environment variables naming the
    # folders its compiled graphs are cached in (the benchmark points them at a fresh folder per measurement).
    compile_backend: str = "inductor"
    compile_cache_vars: tuple[str, ...] = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
    # More than one node: how a launch spans them; None: torchrun --standalone on this machine.
    multi_node: MultiNode | None = None
    # Whether a run without torch.compile compiles graphs too (and caches them in compile_cache_vars): then
    # the benchmark gives its eager run an empty compile cache of its own, as it does the cold compiled run.
    eager_compiles: bool = False
    # What any process that uses the device needs, the stage processes that do (kernel_numerics) as well as
    # torchrun's ranks (launcher_env holds it too): compile caches and runtime settings, none of the
    # launch-only parts (thread counts per rank, multi-node networking).
    device_process_env: dict[str, str] = field(default_factory=dict)
    # The vendor's own collective benchmark, run by verify_ranks after its ranks for the same collectives and sizes:
    # (verify_ranks.collectives, output folder, stage log) -> its record ({"ran": False, "why": ...} where it cannot
    # run). None: the backend has none (cpu).
    vendor_collectives: Callable[[dict[str, Any], Path, Path], dict[str, Any]] | None = None

    def compile_cache_env(self, folder: Path) -> dict[str, str]:
        """Every compile cache of this backend in its own subfolder of `folder`."""
        return {var: str(Path(folder) / var.lower()) for var in self.compile_cache_vars}

    def torchrun_command(
        self, python: str, nproc: int, module: str, args: list[str], *, rank_log_dir: str | Path | None = None
    ) -> list[str]:
        """torchrun for `module` on `nproc` ranks per node; `rank_log_dir` is torchrun's --log-dir (see
        `rank_log_options`). On more than one node the multi-node launcher starts it on every node."""
        if self.multi_node is None:
            launcher, rendezvous = [], ["--standalone"]
        else:
            launcher, rendezvous = list(self.multi_node.launcher), self.multi_node.torchrun_options()
        return [
            *launcher, python, "-m", "torch.distributed.run", *rendezvous, f"--nproc-per-node={nproc}",
            *self.rank_log_options(rank_log_dir), "-m", module, *args,
        ]

    def rank_log_dir(self, stage_log: Path, launch_name: str) -> Path:
        """torchrun's --log-dir for one launch of a stage, next to the stage log: a failing rank's error file
        (torchelastic @record) on every backend, and every rank's own logs where the console shows only some
        ranks (neuron: rank 0 of 64)."""
        return Path(stage_log).parent / "ranks" / launch_name

    def rank_log_options(self, rank_log_dir: str | Path | None) -> list[str]:
        """torchrun's (torch.distributed.run) per-rank files: --log-dir is the folder, where each rank's error
        file goes (<log-dir>/<run id>_<random>/attempt_<n>/<local rank>/error.json). Where the console keeps
        only some ranks, --tee=3 also writes both streams of every rank to {stdout,stderr}.log there and echoes
        them to the console, and --local-ranks-filter keeps only the listed ranks on the console (the files
        keep all); --redirects instead of --tee would leave the stage log with torchrun's own lines only."""
        if rank_log_dir is None:
            return []
        options = [f"--log-dir={rank_log_dir}"]
        if self.console_local_ranks is not None:
            filtered = ",".join(str(r) for r in self.console_local_ranks)
            options += ["--tee=3", f"--local-ranks-filter={filtered}"]
        return options


@runtime_checkable
class BackendModule(Protocol):
    """What a backend's module provides (`backend_module(name)`); tests/backends/test_backends.py holds each to it."""

    REPORT_TITLE: str  # the report's title on this backend: what ran

    def make_backend(self, config: dict[str, Any], cache_root: str) -> Backend: ...

    def config_problems(self, config: dict[str, Any]) -> list[str]:
        """The backend's own rules on the configuration, at parse time (each names the key and what is allowed)."""

    def report_caveat(self, figures: dict[str, dict[str, Any]]) -> str | None:
        """The report's first line on this backend (what its figures do not prove), or None."""

    def prepare_torchtitan(self) -> list[str]:
        """In every trainer rank, before torchtitan runs: what the backend changed (its workarounds), in words."""

    def install_kernels(self) -> dict[str, str]:
        """In a process that runs the replaced modules: the backend's implementation of each kernel put in place;
        returns which runs, per kernel. Its options (neuron: the LNC) come from the process's environment, which
        the backend's launch set."""

    def kernel_limits(self, config: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Per kernel, the sequence lengths its implementation takes (`seq_multiple`, `bad_seq_len`, `why`); empty
        where it takes every length. kernel_numerics shows each rule firing through the installed kernel."""


def backend_module(name: str) -> BackendModule:
    if name not in BACKENDS:
        raise ValueError(f"backend = {name!r}: allowed: {', '.join(BACKENDS)}")
    return importlib.import_module(f"{__name__}.{name}")


def make_backend(config: dict[str, Any], cache_root: str) -> Backend:
    return backend_module(config["backend"]).make_backend(config, cache_root)


def apply_device_process_env(backend: Backend, environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """For a stage's own process that uses the device, before anything touches it (the Neuron runtime reads
    its LNC when it starts): the backend's `device_process_env`, set as torchrun's ranks get it, i.e. over
    what this process had. Returns what was set."""
    environ.update(backend.device_process_env)
    return dict(backend.device_process_env)


# Every thread count a rank's libraries read. Snakemake sets them all to the job's threads for its jobs'
# processes, and torch takes MKL_NUM_THREADS over OMP_NUM_THREADS when they differ: with OMP_NUM_THREADS
# alone capped, 2 ranks on 2 cores ran 2 threads each under Snakemake (10% slower steps than by hand).
THREAD_COUNT_VARS = (
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


def threads_per_rank(ranks_per_node: int) -> int:
    # Ranks share the machine's cores; without a cap each rank starts one thread per core and
    # the ranks oversubscribe the CPU.
    return max(1, (os.cpu_count() or 1) // ranks_per_node)


def thread_caps(ranks_per_node: int) -> dict[str, str]:
    """Every thread count variable at this machine's CPUs / the ranks on it (at least 1), for each rank."""
    return dict.fromkeys(THREAD_COUNT_VARS, str(threads_per_rank(ranks_per_node)))


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


def rank_log_files(rank_log_dir: str | Path) -> dict[int, dict[str, Path]]:
    """The per-rank logs of the latest torchrun launch with `rank_log_dir`, by local rank:
    {local_rank: {"stdout": path, "stderr": path}}; empty when no launch wrote any. torchrun makes a new
    <run id>_<random> folder per launch and an attempt_<n> folder per restart: the newest attempt wins."""
    attempts = sorted(Path(rank_log_dir).glob("*/attempt_*"), key=lambda p: p.stat().st_mtime)
    if not attempts:
        return {}
    files: dict[int, dict[str, Path]] = {}
    for rank_dir in attempts[-1].iterdir():
        if rank_dir.is_dir() and rank_dir.name.isdigit():
            files[int(rank_dir.name)] = {stream: rank_dir / f"{stream}.log" for stream in ("stdout", "stderr")}
    return dict(sorted(files.items()))


def collective_count_dtype():
    """The dtype of integer counts sent through collectives (rank numbers, the router's tokens per expert),
    on every backend. Neuron's collectives take 32-bit types, not int64/float64; int32 holds every count
    here exactly: the largest, the router load of one step summed over all ranks, is global batch x seq_len
    x top_k (64 x 2048 x 4 = 524,288 on trn2), far below 2**31."""
    import torch

    return torch.int32
