"""What the neuron backend reads on the machine: the Neuron tools' output (neuronx-cc, neuron-ls), the system
packages' versions, the devices and their topology. The readers are pure: the tests feed them the tools' recorded
outputs (workflow/resources/neuron/)."""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .config_rules import hbm_per_rank_gib

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
