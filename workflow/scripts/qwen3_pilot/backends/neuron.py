"""The neuron backend: trn2.48xlarge, 16 Trainium2 chips x 8 physical NeuronCores, LNC=2 -> 64 ranks.

It cannot execute on the build machines (AWS's packages come only from AWS's repository), so everything
here is plain functions that tests call with injected readers on the tools' recorded outputs
(workflow/resources/neuron/); execution is claimed only on a trn2.
"""

from __future__ import annotations

import glob
import importlib.metadata
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..parse_time.config import expected_neuron_ranks, hbm_per_rank_gib
from ..problems import problem_list
from . import Backend, cache_env, multi_node_launch, thread_caps

log = logging.getLogger(__name__)

# The report's title on this backend; its stages' own notes say what each figure proves.
REPORT_TITLE = "Qwen3 on AWS Trainium (trn2): pilot audit trail"


def report_caveat(figures: dict[str, dict[str, Any]]) -> None:
    """No first-line caveat: the page reports what ran on the trn2."""
    return None

# The Neuron driver, runtime, collectives and tools (neuron-ls) packages, as AWS's SDK 2.33.0 component list names
# them (workflow/envs/neuron-sdk/<release>.toml [system] and [tools],
# workflow/resources/neuron/sdk-2.33.0-components.md; tests/backends/test_neuron_backend.py holds the two to each
# other); the same names in AWS's apt (Ubuntu) and yum (Amazon Linux 2023) repositories (AWS's manual-install pages
# for each OS).
NEURON_SYSTEM_PACKAGES = (
    "aws-neuronx-dkms", "aws-neuronx-runtime-lib", "aws-neuronx-collectives", "aws-neuronx-tools",
)
# How each package manager prints one installed package's version; the first one on PATH is used
# (dpkg-query first: an Ubuntu box may carry rpm too, an Amazon Linux one has no dpkg).
PACKAGE_QUERIES: dict[str, Callable[[str], list[str]]] = {
    "dpkg-query": lambda package: ["dpkg-query", "-W", "-f=${Version}", package],
    "rpm": lambda package: ["rpm", "-q", "--qf", "%{VERSION}-%{RELEASE}", package],
}
NOT_FOUND = "not found"
DEVICE_GLOB = "/dev/neuron[0-9]*"
# The first line of `neuronx-cc --version` (the other lines name Python, HWM and NumPy versions).
COMPILER_VERSION = re.compile(r"NeuronX Compiler version (\S+)")
COMPILER_DISTRIBUTION = "neuronx-cc"
# The keys of one `neuron-ls --json-output` device that the topology check reads.
DEVICE_KEYS = ("nc_count", "logical_neuroncore_config", "memory_size")
GIB = 2**30
# Dense BF16 peak that torchtitan uses for MFU on trn2: 158 TFLOPS per logical core at LNC=2, i.e. per
# pair of physical cores; at LNC=1 a rank is one physical core, half of that (79 TFLOPS per physical core, the
# figure torchtitan uses for MFU on trn2; AWS's Trainium2 page gives 667 TFLOPS per chip, about 5 % above 8 x 79).
TRN2_BF16_PEAK_FLOPS_PER_PHYSICAL_CORE = 158e12 / 2
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
# The compiler's LNC option in NEURON_CC_FLAGS, as a user may spell it: `--lnc=N` (AWS's NCC_EVRF066 page
# sets NEURON_CC_FLAGS="--lnc=1": https://awsdocs-neuron.readthedocs-hosted.com/en/latest/compiler/
# error-codes/EVRF066.html), `--lnc N`, and the long and short forms `--logical-nc-config` / `-lnc`
# (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-features/
# logical-neuroncore-config.html, which also says the compiler's LNC must be the runtime's).
LNC_OPTION = re.compile(r"(--lnc|-lnc|--logical-nc-config)(?:=(.*))?")


@dataclass(frozen=True)
class ToolOutput:
    """One command's exit code and both streams: some neuronx-cc versions print their version on stderr,
    and a nonzero exit may still carry it."""

    returncode: int
    stdout: str = ""
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def text(self) -> str:
        return f"{self.stdout}\n{self.stderr}"


Runner = Callable[[list[str]], ToolOutput]
NOT_ON_PATH = 127  # the shell's code for a missing command


def peak_flops_per_rank(lnc: int) -> float:
    return TRN2_BF16_PEAK_FLOPS_PER_PHYSICAL_CORE * lnc


def compile_cache_env(cache_root: str) -> dict[str, str]:
    """Compiled graphs and the cache's lock files under the project's cache folder, so that a rerun reuses
    them and nothing lands in /tmp."""
    return {key: f"{cache_root}/neuron/{folder}" for key, folder in {**COMPILE_CACHE_DIRS, **LOCAL_CACHE_DIRS}.items()}


def user_lnc(flags: str) -> tuple[str, str] | None:
    """(the option as written, its value) of the LNC option in a NEURON_CC_FLAGS value; None without one."""
    try:
        words = shlex.split(flags)
    except ValueError:  # an unbalanced quote: the compiler's own parsing is not ours to redo; words as typed
        words = flags.split()
    for index, word in enumerate(words):
        match = LNC_OPTION.fullmatch(word)
        if match:
            value = match.group(2) if match.group(2) is not None else (words[index + 1:index + 2] or [""])[0]
            written = word if match.group(2) is not None else f"{word} {value}".strip()
            return written, value
    return None


def neuron_cc_flags(flags: str, lnc: int) -> str:
    """A user's NEURON_CC_FLAGS with `--lnc=<neuron.lnc>` after them; unchanged where they pass an LNC
    option already (one that differs is refused by `launch_environment_problems`)."""
    if user_lnc(flags) is not None:
        return flags
    return f"{flags} --lnc={lnc}".strip()


def launch_environment_problems(config: dict[str, Any], environ: dict[str, str] | None = None) -> list[str]:
    """What in the launching environment would break the neuron ranks, each naming the variable, its value
    and what to change; refused before any launch (Backend.unavailable_reason, and the preflight)."""
    environ = os.environ if environ is None else environ
    problems = []
    # A container or the Kubernetes Neuron device plugin may preset the cores this process's runtime
    # reserves (https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.0/neuron-runtime/guides/
    # configuration-guide.html, "Using NEURON_RT_VISIBLE_CORES"); every rank would inherit it, while each
    # TorchNeuron rank takes one device, neuron:<local rank>. That a preset list trips TorchNeuron's
    # one-device-per-process assertion is issue 19's report, not found in the torch-neuronx source read here.
    # Refused, not cleared: no AWS source says clearing it is safe under a device plugin.
    visible = environ.get("NEURON_RT_VISIBLE_CORES")
    if visible is not None and visible.strip():
        problems.append(
            f"NEURON_RT_VISIBLE_CORES={visible!r} is set in the launching environment (a container or the "
            "Kubernetes Neuron device plugin sets it); the ranks would all inherit it, and TorchNeuron gives each "
            "rank one device (neuron:<local rank>): unset NEURON_RT_VISIBLE_CORES before the launch "
            "(`unset NEURON_RT_VISIBLE_CORES`, or `env -u NEURON_RT_VISIBLE_CORES snakemake ...`)"
        )
    lnc = config["neuron"]["lnc"]
    flags = environ.get("NEURON_CC_FLAGS", "")
    given = user_lnc(flags)
    if given is not None and given[1] != str(lnc):
        problems.append(
            f"NEURON_CC_FLAGS={flags!r} passes {given[0]}, but neuron.lnc = {lnc} (NEURON_LOGICAL_NC_CONFIG, the "
            f"runtime's LNC, which the compiler's must equal): drop {given[0]} from NEURON_CC_FLAGS (the launch "
            f"adds --lnc={lnc}) or set neuron.lnc"
        )
    return problems


# Collectives between instances go over EFA through libfabric (AWS's multi-node Neuron samples set these; the
# Neuron multi-node setup guide requires EFA on every node).
EFA_ENV = {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1"}


def device_process_env(
    config: dict[str, Any], cache_root: str, environ: dict[str, str] | None = None
) -> dict[str, str]:
    """What every process that uses a NeuronCore needs, a rank or a stage's own process: the compile caches,
    the LNC the runtime starts with, and the same LNC for the compiler after the user's own flags."""
    environ = os.environ if environ is None else environ
    lnc = str(config["neuron"]["lnc"])
    return {
        **compile_cache_env(cache_root),
        # The logical-neuroncore-config page (linked above) names NEURON_LOGICAL_NC_CONFIG as the runtime's LNC
        # variable; AWS's own NxD Inference guides export NEURON_RT_VIRTUAL_CORE_SIZE=$LNC instead
        # (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/libraries/nxd-inference/developer_guides/
        # weights-sharding-guide.html). No AWS page we found says which runtime reads which, so both get the LNC.
        "NEURON_LOGICAL_NC_CONFIG": lnc,
        "NEURON_RT_VIRTUAL_CORE_SIZE": lnc,
        "NEURON_CC_FLAGS": neuron_cc_flags(environ.get("NEURON_CC_FLAGS", ""), config["neuron"]["lnc"]),
    }


def launcher_env(config: dict[str, Any], cache_root: str, environ: dict[str, str] | None = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    # More than one node: the EFA settings, except where the user set their own. NEURON_RT_ROOT_COMM_ID stays
    # unset: TorchNeuron's process group sets it to MASTER_ADDR (global rank 0's host, which the c10d
    # rendezvous chooses, not always the first node) with a free port agreed through the store.
    efa = {key: value for key, value in EFA_ENV.items() if key not in environ} if config["nodes"] > 1 else {}
    # Each rank's thread counts capped at the host's CPUs / the ranks on it, as on cpu: uncapped, 64 ranks
    # would each start a thread per host CPU (192 on a trn2.48xlarge) while they compile.
    threads = thread_caps(expected_neuron_ranks(config["neuron"]))
    return {**cache_env(cache_root), **threads, **device_process_env(config, cache_root, environ), **efa}


def unavailable_reason(device_paths: list[str], expected_chips: int) -> str | None:
    if not device_paths:
        return "no Neuron devices (/dev/neuron*) on this machine: the neuron backend needs a trn2 instance"
    if len(device_paths) != expected_chips:
        return f"found {len(device_paths)} Neuron devices, expected {expected_chips} (neuron.chips)"
    return None


# ---- readers of the Neuron tools' output (pure: the tests feed them recorded outputs) ----


def compiler_version(
    output: ToolOutput, distribution_version: Callable[[str], str] | None = None
) -> tuple[str, str]:
    """(version, where it was read) from `neuronx-cc --version` on either stream, whatever its exit code;
    else from the neuronx-cc distribution's metadata; else NOT_FOUND."""
    match = COMPILER_VERSION.search(output.text)
    if match:
        return match.group(1), "neuronx-cc --version"
    try:
        return (distribution_version or importlib.metadata.version)(COMPILER_DISTRIBUTION), "pip metadata"
    except importlib.metadata.PackageNotFoundError:
        return NOT_FOUND, "neither `neuronx-cc --version` nor the neuronx-cc distribution"


def parse_devices(devices_json_text: str) -> list[dict[str, Any]]:
    """`neuron-ls --json-output`: one object per device, only the mapped ones inside a container."""
    devices = json.loads(devices_json_text)
    if not isinstance(devices, list):
        raise ValueError(f"neuron-ls --json-output: expected a list of devices, got {type(devices).__name__}")
    return devices


def device_figures(devices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per device: its logical cores (nc_count), LNC, HBM and HBM per logical core, i.e. per rank."""
    figures = []
    for index, device in enumerate(devices):
        row = {"neuron_device": device.get("neuron_device", index), **{k: device.get(k) for k in DEVICE_KEYS}}
        if isinstance(row["memory_size"], int) and isinstance(row["nc_count"], int) and row["nc_count"] > 0:
            row["memory_gib"] = row["memory_size"] / GIB
            row["hbm_per_rank_gib"] = row["memory_size"] / row["nc_count"] / GIB
        figures.append(row)
    return figures


def neuron_topology(
    devices_json_text: str, neuron: dict[str, Any], ranks: int
) -> tuple[dict[str, Any], list[str]]:
    """The devices `neuron-ls --json-output` lists against the config: their logical cores must add up to
    `ranks`, each device's LNC must be neuron.lnc, and its HBM per logical core (= per rank) is compared
    with neuron.hbm_per_chip_gib / (cores_per_chip / lnc). Returns (figures, problems)."""
    try:
        devices = parse_devices(devices_json_text)
    except ValueError as error:  # json.JSONDecodeError is one
        return {}, [f"neuron-ls --json-output is not a device list: {error}"]
    rows = device_figures(devices)
    problems = [
        f"neuron-ls device {row['neuron_device']}: no {key} in its JSON (expected keys: {', '.join(DEVICE_KEYS)})"
        for row in rows for key in DEVICE_KEYS if not isinstance(row[key], int)
    ]
    if problems:
        return {"devices": rows}, problems
    lnc, cores_per_chip = neuron["lnc"], neuron["cores_per_chip"]
    logical_per_chip = cores_per_chip // lnc
    for row in rows:
        if row["logical_neuroncore_config"] != lnc:
            problems.append(
                f"neuron-ls device {row['neuron_device']}: logical_neuroncore_config = "
                f"{row['logical_neuroncore_config']}, expected neuron.lnc = {lnc} (NEURON_LOGICAL_NC_CONFIG)"
            )
        if row["nc_count"] != logical_per_chip:
            problems.append(
                f"neuron-ls device {row['neuron_device']}: nc_count = {row['nc_count']} logical cores, expected "
                f"neuron.cores_per_chip / neuron.lnc = {cores_per_chip} / {lnc} = {logical_per_chip}"
            )
    logical_cores = sum(row["nc_count"] for row in rows)
    if logical_cores != ranks:
        problems.append(
            f"neuron-ls lists {logical_cores} logical NeuronCores on {len(rows)} device(s), expected ranks = "
            f"{ranks} (neuron.chips = {neuron['chips']} devices x {logical_per_chip}); inside a container only "
            "the mapped devices appear"
        )
    measured = min(row["hbm_per_rank_gib"] for row in rows) if rows else None
    configured = hbm_per_rank_gib(neuron)
    # Less HBM than configured makes every memory budget derived from the config too generous; more is
    # recorded but harmless.
    if measured is not None and measured < configured:
        problems.append(
            f"neuron-ls: {measured:g} GiB HBM per logical core (memory_size / nc_count), expected neuron."
            f"hbm_per_chip_gib / (cores_per_chip / lnc) = {neuron['hbm_per_chip_gib']} / {logical_per_chip} "
            f"= {configured:g} GiB"
        )
    figures = {
        "devices": rows,
        "device_count": len(rows),
        "logical_cores": logical_cores,
        "expected_logical_cores": ranks,
        "lnc": sorted({row["logical_neuroncore_config"] for row in rows}),
        "hbm_per_rank_gib": measured,
        "configured_hbm_per_rank_gib": configured,
    }
    return figures, problems


# ---- what the backend reads on the machine ----


def package_query(which: Callable[[str], str | None] = shutil.which) -> tuple[str, Callable[[str], list[str]]] | None:
    """The package manager on PATH and its version query, or None."""
    for tool, query in PACKAGE_QUERIES.items():
        if which(tool):
            return tool, query
    return None


def read_system_versions(
    run: Runner | None = None,
    which: Callable[[str], str | None] = shutil.which,
    distribution_version: Callable[[str], str] | None = None,
) -> dict[str, Any]:
    """Driver, runtime, collectives, tools and compiler versions ('not found' for each one missing), and
    each device that neuron-ls lists with its cores, LNC and HBM."""
    run = run or _run
    query = package_query(which)
    versions: dict[str, Any] = {
        "package_manager": query[0] if query else f"{NOT_FOUND} ({' or '.join(PACKAGE_QUERIES)})",
        **read_os_packages(NEURON_SYSTEM_PACKAGES, run, which),
    }
    versions["neuronx-cc"], versions["neuronx-cc_read_from"] = compiler_version(
        run(["neuronx-cc", "--version"]), distribution_version
    )
    neuron_ls = run(["neuron-ls", "--json-output"])
    try:
        devices = device_figures(parse_devices(neuron_ls.stdout)) if neuron_ls.ok else []
    except ValueError:
        devices = []
    versions["neuron_ls_devices"] = len(devices)
    versions["neuron_devices"] = devices
    versions["nkilib"] = module_distribution("nkilib")
    return versions


def read_os_packages(packages: Any, run: Runner | None = None,
                     which: Callable[[str], str | None] = shutil.which) -> dict[str, str]:
    """Each OS package's installed version as the package manager prints it ('not found' when it or the
    package manager is missing): one query per package, nothing else run (the Snakefile calls this)."""
    run, query = run or _run, package_query(which)
    versions = {}
    for package in packages:
        output = run(query[1](package)) if query else ToolOutput(NOT_ON_PATH)
        versions[package] = output.stdout.strip() if output.ok and output.stdout.strip() else NOT_FOUND
    return versions


def module_distribution(module: str, distributions: Callable[[], dict[str, list[str]]] | None = None) -> str:
    """Which installed distribution provides a top-level module, with its version: nkilib (the NKI
    Library, whose rope_hf kernel the neuron backend calls) is not pinned, because where it comes from on a
    TorchNeuron install (its own wheel, or bundled) is not established here; the record says."""
    provided = (distributions or importlib.metadata.packages_distributions)().get(module, [])
    if not provided:
        return NOT_FOUND
    return ", ".join(f"{name} {importlib.metadata.version(name)}" for name in sorted(set(provided)))


def read_topology(neuron: dict[str, Any], ranks: int, run: Runner | None = None) -> tuple[dict[str, Any], list[str]]:
    """`neuron_topology` on this machine's `neuron-ls --json-output`."""
    output = (run or _run)(["neuron-ls", "--json-output"])
    if not output.ok:
        detail = "not on PATH" if output.returncode == NOT_ON_PATH else output.stderr.strip() or output.stdout.strip()
        return {}, [
            f"neuron-ls --json-output failed (exit {output.returncode}: {detail}); it comes with aws-neuronx-tools"
        ]
    return neuron_topology(output.stdout, neuron, ranks)


def _run(command: list[str]) -> ToolOutput:
    if shutil.which(command[0]) is None:
        return ToolOutput(NOT_ON_PATH, "", f"{command[0]}: not on PATH")
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return ToolOutput(-1, "", str(error))
    return ToolOutput(result.returncode, result.stdout, result.stderr)


def make_backend(config: dict[str, Any], cache_root: str) -> Backend:
    neuron = config["neuron"]
    multi_node = multi_node_launch(config)
    return Backend(
        name="neuron",
        device_type="neuron",
        dist_backend="neuron",
        ranks_per_node=expected_neuron_ranks(neuron),
        expected_ranks=expected_neuron_ranks(neuron) * config["nodes"],
        launcher_env=launcher_env(config, cache_root),
        device_process_env=device_process_env(config, cache_root),
        unavailable_reason="; ".join(reason for reason in (
            unavailable_reason(sorted(glob.glob(DEVICE_GLOB)), neuron["chips"]), *launch_environment_problems(config),
            multi_node.problem if multi_node else None) if reason) or None,
        multi_node=multi_node,
        system_versions=read_system_versions,
        device_for_local_rank=lambda local_rank: f"neuron:{local_rank}",
        peak_flops_per_rank=peak_flops_per_rank(neuron["lnc"]),
        peak_flops_source=(
            f"trn2 dense BF16 peak, 158 TFLOPS per logical core at LNC=2 (torchtitan's figure), "
            f"at LNC={neuron['lnc']}: {peak_flops_per_rank(neuron['lnc']) / 1e12:g} TFLOPS per rank; AWS's "
            "Trainium2 chip page gives 667 dense BF16 TFLOPS per chip (8 physical cores), about 5% above 8 x 79"
        ),
        # Rank 0's output in the stage log, every rank's in its own files (when the caller names a folder).
        console_local_ranks=(0,),
        topology=lambda: read_topology(neuron, config["ranks"]),
        # torchtitan's --compile.backend neuron (TorchNeuron) caches its NEFFs in TORCH_NEURONX_NEFF_CACHE_DIR.
        compile_backend="neuron",
        compile_cache_vars=tuple(COMPILE_CACHE_DIRS),
        # Eager mode compiles each graph with neuronx-cc and caches the NEFF just as torch.compile does
        # (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/compiler/about-compiler-artifacts.html).
        eager_compiles=True,
        vendor_collectives=lambda collectives, out_dir, log_path: nccom_test_record(
            config, cache_root, collectives, out_dir, log_path),
    )


def nccom_test_record(config: dict[str, Any], cache_root: str, collectives: dict[str, Any], out_dir, log_path):
    """AWS's nccom-test over this instance's ranks (backends/nccom_test.py), where it can run: on one instance (across
    instances it needs its own MPI or SLURM mode, which verify_ranks does not drive)."""
    from .nccom_test import run_nccom_test

    if config["nodes"] > 1:
        return {"ran": False, "why": f"nodes = {config['nodes']}: nccom-test across instances needs its MPI or SLURM "
                                     "mode, which verify_ranks does not drive"}
    return run_nccom_test(expected_neuron_ranks(config["neuron"]), collectives, out_dir, log_path,
                          shutil.which("nccom-test"), {**os.environ, **device_process_env(config, cache_root)})


# ---- in every process that uses the neuron device ----


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


def install_kernels(lnc: int) -> dict[str, str]:
    """Routes the kernels to their neuron implementations in this process (rope_hf: the NKI Library kernel
    launched on `lnc` logical cores) and returns which implementation runs per kernel. Fails at once,
    naming every missing package, where the Neuron packages are not installed."""
    import importlib

    from ..titan.kernels import KERNELS, implementation, set_implementation

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
    from ..titan.kernels.rope import register_neuron_kernel

    register_neuron_kernel(lnc)
    set_implementation("rope_hf", f"NKI: {NKI_ROPE_MODULE}.rope_hf[{lnc}] on {lnc} logical core(s) per rank, "
                                  "registered with torch_neuronx.nki_op")
    set_implementation("moe_grouped_experts", NEURON_EXPERTS_IMPLEMENTATION)
    return {kernel: implementation(kernel) for kernel in KERNELS}
