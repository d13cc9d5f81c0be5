"""The neuron backend: trn2.48xlarge, 16 Trainium2 chips x 8 physical NeuronCores, LNC=2 -> 64 ranks.

It cannot execute on the build machines (AWS's packages come only from AWS's repository), so everything
here is plain functions that tests call with injected readers on the tools' recorded outputs
(workflow/resources/neuron/); execution is claimed only on a trn2.

- this module: the backend as the stages see it (make_backend), its launch environment and compile caches;
- machine.py: what it reads on the machine (the Neuron tools' output, packages, devices, topology);
- in_process.py: what every process that uses the device does first, and the NKI kernels' installation;
- nccom_test.py: AWS's collective benchmark, run beside verify_ranks' own.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import shutil
from typing import Any

from .. import Backend, cache_env, multi_node_launch, thread_caps

# config_problems: the backend's rules on the configuration (parse_time.config asks the configured backend).
from .config_rules import config_problems, expected_neuron_ranks  # noqa: F401

# prepare_torchtitan and install_kernels: the backend's part in every trainer process (backends.backend_module).
from .in_process import COMPILE_CACHE_DIRS, LOCAL_CACHE_DIRS, install_kernels, prepare_torchtitan  # noqa: F401

# kernel_limits: what the kernels take (kernel_numerics checks the rule firing through the installed kernel).
from .kernel_limits import kernel_limits  # noqa: F401
from .machine import DEVICE_GLOB, read_system_versions, read_topology

# The report's title on this backend; its stages' own notes say what each figure proves.
REPORT_TITLE = "Qwen3 on AWS Trainium (trn2): pilot audit trail"


def report_caveat(figures: dict[str, dict[str, Any]]) -> None:
    """No first-line caveat: the page reports what ran on the trn2."""
    return None


# Dense BF16 peak that torchtitan uses for MFU on trn2: 158 TFLOPS per logical core at LNC=2, i.e. per
# pair of physical cores; at LNC=1 a rank is one physical core, half of that (79 TFLOPS per physical core, the
# figure torchtitan uses for MFU on trn2; AWS's Trainium2 page gives 667 TFLOPS per chip, about 5 % above 8 x 79).
TRN2_BF16_PEAK_FLOPS_PER_PHYSICAL_CORE = 158e12 / 2
# The compiler's LNC option in NEURON_CC_FLAGS, as a user may spell it: `--lnc=N` (AWS's NCC_EVRF066 page
# sets NEURON_CC_FLAGS="--lnc=1": https://awsdocs-neuron.readthedocs-hosted.com/en/latest/compiler/
# error-codes/EVRF066.html), `--lnc N`, and the long and short forms `--logical-nc-config` / `-lnc`
# (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-features/
# logical-neuroncore-config.html, which also says the compiler's LNC must be the runtime's).
LNC_OPTION = re.compile(r"(--lnc|-lnc|--logical-nc-config)(?:=(.*))?")


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
    """AWS's nccom-test over this instance's ranks (nccom_test.py), where it can run: on one instance (across
    instances it needs its own MPI or SLURM mode, which verify_ranks does not drive)."""
    from .nccom_test import run_nccom_test

    if config["nodes"] > 1:
        return {"ran": False, "why": f"nodes = {config['nodes']}: nccom-test across instances needs its MPI or SLURM "
                                     "mode, which verify_ranks does not drive"}
    return run_nccom_test(expected_neuron_ranks(config["neuron"]), collectives, out_dir, log_path,
                          shutil.which("nccom-test"), {**os.environ, **device_process_env(config, cache_root)})
