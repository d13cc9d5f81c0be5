"""The neuron backend's readers on the Neuron tools' real outputs, recorded on trn2 machines
(workflow/resources/neuron/, copied byte for byte from the shared data), and the ordering and dtype rules a trn2
needs, checked on CPU."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
import sys

import pytest
import yaml
from conftest import PROJECT, backend_config, default_config

from qwen3_pilot.backends import make_backend
from qwen3_pilot.backends.neuron.in_process import COMPILE_CACHE_DIRS, prepare_torchtitan
from qwen3_pilot.backends.neuron.machine import (
    NEURON_SYSTEM_PACKAGES,
    ToolOutput,
    compiler_version,
    neuron_topology,
    read_system_versions,
    read_topology,
)
from qwen3_pilot.paths import WORKFLOW
from qwen3_pilot.ranks import RankCheckError, verify_ranks

RECORDED = WORKFLOW / "resources" / "neuron"
TRN2 = yaml.safe_load((PROJECT / "config" / "trn2.yaml").read_text())
# The machine the one-device recording describes, as a config: one trn2 chip, 8 physical cores, LNC 2.
ONE_CHIP = {**TRN2["neuron"], "chips": 1}
ONE_CHIP_RANKS = ONE_CHIP["chips"] * ONE_CHIP["cores_per_chip"] // ONE_CHIP["lnc"]


def recorded(name: str) -> str:
    return (RECORDED / name).read_text()


def sixteen_devices() -> str:
    """A whole trn2.48xlarge in `neuron-ls --json-output` form, built from the recorded one-device container
    JSON (no 16-device JSON is on record): device i with cores 4i..4i+3, everything else as recorded."""
    (device,) = json.loads(recorded("neuron-ls.trn2-container.json"))
    devices = []
    for index in range(16):
        copied = copy.deepcopy(device)
        copied["neuron_device"] = index
        copied["neuroncore_ids"] = [index * device["nc_count"] + core for core in range(device["nc_count"])]
        devices.append(copied)
    return json.dumps(devices)


# ---- 1. the compiler version ----


def test_the_compiler_version_is_read_from_its_line_not_the_last_one():
    text = recorded("neuronx-cc-version.txt")
    assert text.strip().splitlines()[-1].startswith("NumPy version")  # what the last line holds
    assert compiler_version(ToolOutput(0, text, "")) == ("2.27.5334.0+f702b353", "neuronx-cc --version")


def test_the_compiler_version_is_found_on_stderr_and_after_a_nonzero_exit():
    text = recorded("neuronx-cc-version.txt")
    assert compiler_version(ToolOutput(0, "", text))[0] == "2.27.5334.0+f702b353"
    assert compiler_version(ToolOutput(1, "", text))[0] == "2.27.5334.0+f702b353"


def test_without_the_command_the_compiler_version_comes_from_pip_metadata():
    assert compiler_version(ToolOutput(127), lambda name: {"neuronx-cc": "2.27.5334.0"}[name]) == (
        "2.27.5334.0", "pip metadata"
    )


def test_a_compiler_found_nowhere_is_reported_as_not_found():
    import importlib.metadata

    def no_distribution(name):
        raise importlib.metadata.PackageNotFoundError(name)

    version, source = compiler_version(ToolOutput(127), no_distribution)
    assert version == "not found" and "neuronx-cc" in source


# ---- 2. neuron-ls: devices, logical cores, LNC and HBM against the config ----


def test_the_recorded_one_device_container_matches_a_one_chip_config():
    figures, problems = neuron_topology(recorded("neuron-ls.trn2-container.json"), ONE_CHIP, ONE_CHIP_RANKS)
    assert problems == []
    assert figures["logical_cores"] == ONE_CHIP_RANKS == 4
    assert figures["lnc"] == [2]
    assert figures["hbm_per_rank_gib"] == figures["configured_hbm_per_rank_gib"] == 24.0
    assert figures["devices"][0]["memory_gib"] == 96.0


def test_a_whole_trn2_matches_the_trn2_config():
    figures, problems = neuron_topology(sixteen_devices(), TRN2["neuron"], TRN2["ranks"])
    assert problems == []
    assert (figures["device_count"], figures["logical_cores"]) == (16, 64)
    assert figures["hbm_per_rank_gib"] == 24.0


def test_a_wrong_lnc_is_named_with_its_value_and_the_configured_one():
    devices = json.loads(sixteen_devices())
    for device in devices:  # what the same machine lists at LNC 1
        device["logical_neuroncore_config"], device["nc_count"] = 1, 8
    _, problems = neuron_topology(json.dumps(devices), TRN2["neuron"], TRN2["ranks"])
    text = "\n".join(problems)
    assert "device 0: logical_neuroncore_config = 1, expected neuron.lnc = 2" in text
    assert "device 0: nc_count = 8 logical cores, expected neuron.cores_per_chip / neuron.lnc = 8 / 2 = 4" in text
    assert "lists 128 logical NeuronCores on 16 device(s), expected ranks = 64" in text
    assert "12 GiB HBM per logical core" in text


def test_too_few_devices_are_named_with_the_count_expected():
    # The recorded container maps one device; the trn2 config wants all sixteen.
    _, problems = neuron_topology(recorded("neuron-ls.trn2-container.json"), TRN2["neuron"], TRN2["ranks"])
    assert problems == [
        "neuron-ls lists 4 logical NeuronCores on 1 device(s), expected ranks = 64 (neuron.chips = 16 devices "
        "x 4); inside a container only the mapped devices appear"
    ]


def test_less_hbm_than_configured_is_a_problem():
    config = {**ONE_CHIP, "hbm_per_chip_gib": 128}
    _, problems = neuron_topology(recorded("neuron-ls.trn2-container.json"), config, ONE_CHIP_RANKS)
    assert problems == [
        "neuron-ls: 24 GiB HBM per logical core (memory_size / nc_count), expected neuron.hbm_per_chip_gib / "
        "(cores_per_chip / lnc) = 128 / 4 = 32 GiB"
    ]


@pytest.mark.parametrize("lnc, budget", [(2, 24), (1, 12)])
def test_the_plans_hbm_budget_is_a_ranks_share_of_a_chip_at_the_configured_lnc(lnc, budget):
    config = default_config({"neuron": {"lnc": lnc}})
    assert config["plan"]["hbm_per_rank_gib"] == budget
    assert default_config({"neuron": {"lnc": lnc}, "plan": {"hbm_per_rank_gib": 20}})["plan"]["hbm_per_rank_gib"] == 20


def test_verify_ranks_plans_with_neuron_ls_hbm_per_rank_where_it_is_below_the_budget():
    from qwen3_pilot.stages.verify_ranks import hbm_budget

    measured, _ = neuron_topology(recorded("neuron-ls.trn2-container.json"), ONE_CHIP, ONE_CHIP_RANKS)
    assert measured["hbm_per_rank_gib"] == 24
    budget, source = hbm_budget(32, measured)
    assert budget == 24 and source.startswith("neuron-ls: 24 GiB per logical core (below plan.hbm_per_rank_gib 32)")
    assert hbm_budget(20, measured)[0] == 20  # neuron-ls reports more: the configured budget holds
    assert hbm_budget(24, None) == (24, "plan.hbm_per_rank_gib 24 GiB (no neuron-ls on this backend)")


def test_a_device_without_a_checked_key_and_text_that_is_not_json_are_named():
    devices = json.loads(recorded("neuron-ls.trn2-container.json"))
    del devices[0]["memory_size"]
    _, problems = neuron_topology(json.dumps(devices), ONE_CHIP, ONE_CHIP_RANKS)
    assert problems == [
        "neuron-ls device 0: no memory_size in its JSON (expected keys: nc_count, logical_neuroncore_config, "
        "memory_size)"
    ]
    # The plain table is what neuron-ls prints without --json-output.
    _, problems = neuron_topology(recorded("neuron-ls.trn2-container.txt"), ONE_CHIP, ONE_CHIP_RANKS)
    assert problems[0].startswith("neuron-ls --json-output is not a device list")


def test_read_topology_names_the_package_when_neuron_ls_is_missing():
    _, problems = read_topology(TRN2["neuron"], TRN2["ranks"], run=lambda command: ToolOutput(127))
    assert problems == [
        "neuron-ls --json-output failed (exit 127: not on PATH); it comes with aws-neuronx-tools"
    ]


def test_verify_ranks_stops_on_a_topology_problem_before_launching_any_rank(tmp_path):
    backend = dataclasses.replace(
        make_backend(backend_config("cpu", 2), str(tmp_path / "cache")),
        topology=lambda: neuron_topology(recorded("neuron-ls.trn2-container.json"), TRN2["neuron"], TRN2["ranks"]),
    )
    with pytest.raises(RankCheckError, match="expected ranks = 64") as raised:
        verify_ranks(backend, tmp_path / "ranks", tmp_path / "log.txt")
    assert "the cpu devices do not match the config" in str(raised.value)
    assert not (tmp_path / "log.txt").exists()  # torchrun never started


def test_the_neuron_backend_offers_its_topology_check(tmp_path):
    backend = make_backend(backend_config("neuron", 64, neuron=TRN2["neuron"]), str(tmp_path))
    assert backend.topology is not None
    assert make_backend(backend_config("cpu", 2), str(tmp_path)).topology is None


# ---- system versions: per-device figures, dpkg on Ubuntu, rpm on Amazon Linux 2023 ----


def recorded_tools(package_answer):
    """A runner that answers the Neuron tools with their recorded output, packages with `package_answer`."""

    def run(command):
        if command[0] == "neuronx-cc":
            return ToolOutput(0, recorded("neuronx-cc-version.txt"))
        if command[0] == "neuron-ls":
            return ToolOutput(0, recorded("neuron-ls.trn2-container.json"))
        return package_answer(command)

    return run


def test_system_versions_record_each_device_that_neuron_ls_lists():
    versions = read_system_versions(recorded_tools(lambda c: ToolOutput(1)), which=lambda tool: None)
    assert versions["neuronx-cc"] == "2.27.5334.0+f702b353"
    assert versions["neuron_ls_devices"] == 1
    (device,) = versions["neuron_devices"]
    assert (device["nc_count"], device["logical_neuroncore_config"], device["memory_size"]) == (4, 2, 103079215104)
    assert device["hbm_per_rank_gib"] == 24.0


def test_system_packages_are_read_with_dpkg_query_on_ubuntu():
    seen = []

    def dpkg(command):
        seen.append(command)
        return ToolOutput(0, "2.22.2.0") if command[-1] == "aws-neuronx-tools" else ToolOutput(1, "", "no packages")

    versions = read_system_versions(recorded_tools(dpkg), which={"dpkg-query": "/usr/bin/dpkg-query"}.get)
    assert versions["package_manager"] == "dpkg-query"
    assert seen[0] == ["dpkg-query", "-W", "-f=${Version}", NEURON_SYSTEM_PACKAGES[0]]
    assert versions["aws-neuronx-tools"] == "2.22.2.0" and versions["aws-neuronx-dkms"] == "not found"


def test_system_packages_are_read_with_rpm_on_amazon_linux():
    def rpm(command):
        assert command[:3] == ["rpm", "-q", "--qf"] and command[3] == "%{VERSION}-%{RELEASE}"
        if command[-1] == "aws-neuronx-runtime-lib":
            return ToolOutput(0, "2.28.23.0-dc38b6d11")
        # rpm's answer for a missing package, on stdout with exit code 1.
        return ToolOutput(1, f"package {command[-1]} is not installed\n")

    versions = read_system_versions(recorded_tools(rpm), which={"rpm": "/usr/bin/rpm"}.get)
    assert versions["package_manager"] == "rpm"
    assert versions["aws-neuronx-runtime-lib"] == "2.28.23.0-dc38b6d11"
    assert versions["aws-neuronx-collectives"] == "not found"


def test_without_a_package_manager_every_package_is_not_found():
    versions = read_system_versions(recorded_tools(lambda c: pytest.fail(f"ran {c}")), which=lambda tool: None)
    assert versions["package_manager"] == "not found (dpkg-query or rpm)"
    assert all(versions[p] == "not found" for p in NEURON_SYSTEM_PACKAGES)


# ---- 5. torch_neuronx before any neuron device ----

# What importing the real torch_neuronx does to the device type name, with nothing else: after it,
# torch.device("neuron", n) parses; before it, torch raises "Expected one of cpu, cuda, ... device type".
FAKE_TORCH_NEURONX = "import torch\ntorch.utils.rename_privateuse1_backend('neuron')\n"


def test_the_rank_worker_imports_torch_neuronx_before_making_its_device(tmp_path):
    (tmp_path / "torch_neuronx.py").write_text(FAKE_TORCH_NEURONX)
    # A fresh interpreter: the device name cannot be renamed back in this one.
    code = "from qwen3_pilot.titan.in_ranks.rank_worker import device_for; print(device_for('neuron', 3))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "neuron:3"


class RecordingDeviceModule:
    """A torch device module (torch.cuda's interface, which torchtitan's memory monitor calls) that records
    the order of the calls and answers with an allocator's figures."""

    GIB = 2**30
    ANSWERS = {
        "get_device_name": "fake device", "current_device": 0,
        "get_device_properties": type("Properties", (), {"total_memory": 24 * GIB})(),
        # TorchNeuron's form: byte figures nested under current/peak, two counters beside them.
        "memory_stats": {"active_bytes": {"current": 1 * GIB, "peak": 6 * GIB},
                         "reserved_bytes": {"current": 2 * GIB, "peak": 12 * GIB},
                         "allocated_bytes": {"current": 1 * GIB, "peak": 6 * GIB},
                         "num_alloc_retries": 0, "num_ooms": 0, "num_tensor_frees": 3, "allocation_requests": 9},
    }

    def __init__(self):
        self.calls: list[str] = []
        self.ANSWERS = copy.deepcopy(self.ANSWERS)

    def __getattr__(self, name):
        def call(*args, **kwargs):
            self.calls.append(name)
            return self.ANSWERS.get(name)

        return call


@pytest.fixture
def fake_device_module(monkeypatch):
    """torchtitan's metrics module reading a recording device module; its monitor builder restored after."""
    import torchtitan.components.metrics as tt_metrics

    device_module = RecordingDeviceModule()
    monkeypatch.setattr(tt_metrics, "device_module", device_module)
    monkeypatch.setattr(tt_metrics, "build_device_memory_monitor", lambda: tt_metrics.DeviceMemoryMonitor("cpu"))
    return device_module


def test_the_memory_monitor_reads_the_peaks_after_a_synchronize(fake_device_module):
    import torchtitan.components.metrics as tt_metrics

    from qwen3_pilot.backends.neuron.in_process import SynchronizedMemoryMonitor

    # torchtitan's own monitor on a cpu device object: torch.device("neuron") only parses with torch_neuronx.
    monitor = SynchronizedMemoryMonitor(tt_metrics.DeviceMemoryMonitor("cpu"), fake_device_module,
                                        tt_metrics.DeviceMemStats)
    fake_device_module.calls.clear()
    stats = monitor.get_peak_stats()
    assert fake_device_module.calls == ["synchronize", "memory_stats"]
    assert (stats.max_active_gib, stats.max_reserved_gib, stats.max_reserved_pct) == (6, 12, 50)
    assert monitor.device_name == "fake device" and monitor.device_capacity_gib == 24
    monitor.reset_peak_stats()
    assert fake_device_module.calls[-1] == "reset_peak_memory_stats"
    # CUDA's flat spelling of the same figures reads the same.
    gib = RecordingDeviceModule.GIB
    fake_device_module.ANSWERS["memory_stats"] = {"active_bytes.all.peak": 6 * gib,
                                                  "reserved_bytes.all.peak": 12 * gib, "num_alloc_retries": 0,
                                                  "num_ooms": 0}
    assert monitor.get_peak_stats().max_active_gib == 6


@pytest.mark.parametrize("missing", ["active_bytes", "num_ooms"])
def test_a_memory_stat_the_device_does_not_give_is_an_error_naming_it_not_a_figure(fake_device_module, missing):
    """torchtitan's own monitor reads a missing key as -1 byte, i.e. a peak of -0.00 GiB."""
    import torchtitan.components.metrics as tt_metrics

    from qwen3_pilot.backends.neuron.in_process import SynchronizedMemoryMonitor

    del fake_device_module.ANSWERS["memory_stats"][missing]
    monitor = SynchronizedMemoryMonitor(tt_metrics.DeviceMemoryMonitor("cpu"), fake_device_module,
                                        tt_metrics.DeviceMemStats)
    with pytest.raises(KeyError, match=f"torch.neuron.memory_stats\\(\\) has no '{missing}'") as raised:
        monitor.get_peak_stats()
    assert "its keys: active_bytes" in str(raised.value) or "its keys: allocated_bytes" in str(raised.value)
    assert "num_tensor_frees" in str(raised.value)


def test_prepare_torchtitan_imports_torch_neuronx_and_makes_the_compile_cache_folders(
    tmp_path, monkeypatch, fake_device_module
):
    import torchtitan.components.metrics as tt_metrics

    (tmp_path / "torch_neuronx.py").write_text("IMPORTED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    # Recorded so that the fake module leaves sys.modules after the test, then out of the way of the import.
    monkeypatch.setitem(sys.modules, "torch_neuronx", None)
    del sys.modules["torch_neuronx"]
    for key in COMPILE_CACHE_DIRS:
        monkeypatch.setenv(key, str(tmp_path / "cache" / key))
    assert prepare_torchtitan() == ["memory_monitor_synchronize"]
    assert sys.modules["torch_neuronx"].IMPORTED
    assert all((tmp_path / "cache" / key).is_dir() for key in COMPILE_CACHE_DIRS)
    # What the trainer's MetricsProcessor builds from then on.
    monitor = tt_metrics.build_device_memory_monitor()
    fake_device_module.calls.clear()
    monitor.get_peak_stats()
    assert fake_device_module.calls == ["synchronize", "memory_stats"]


def test_without_torch_neuronx_the_neuron_processes_stop_naming_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_neuronx", None)  # import raises ImportError
    with pytest.raises(ImportError, match="the neuron backend needs torch_neuronx"):
        prepare_torchtitan()


# ---- 6. the launch environment, as the preflight prints it ----


def printed_launches(monkeypatch, tmp_path, **environ):
    """The preflight's launch plan of config/trn2.yaml with `environ` in the launching environment (None
    unsets a variable): what `make preflight` prints for every neuron stage."""
    from qwen3_pilot.tools.preflight.launches import launch_plan
    from qwen3_pilot.tools.preflight.run import load_config

    for key in ("NEURON_RT_VISIBLE_CORES", "NEURON_CC_FLAGS"):
        monkeypatch.delenv(key, raising=False)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    files = [PROJECT / "config" / "trn2.yaml"]
    config = load_config(files)
    backend = make_backend(config, str(tmp_path / "cache"))
    return backend, launch_plan(config, backend, PROJECT, files)


def test_each_neuron_rank_gets_the_cpu_backends_thread_caps_at_host_cpus_over_ranks(tmp_path, monkeypatch):
    from qwen3_pilot.backends import THREAD_COUNT_VARS

    monkeypatch.setattr(os, "cpu_count", lambda: 192)  # a trn2.48xlarge
    _, launches = printed_launches(monkeypatch, tmp_path)
    torchrun = [launch for launch in launches if "torch.distributed.run" in launch["command"]]
    assert torchrun and all({key: launch["env"].get(key) for key in THREAD_COUNT_VARS}
                            == dict.fromkeys(THREAD_COUNT_VARS, "3") for launch in torchrun)  # 192 / 64
    # Never below one thread; the stage's own process (kernel_numerics) is no rank and keeps its own.
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    backend = make_backend(backend_config("neuron", 64, neuron=TRN2["neuron"]), str(tmp_path))
    assert backend.launcher_env["OMP_NUM_THREADS"] == "1" and "OMP_NUM_THREADS" not in backend.device_process_env


def test_a_preset_neuron_rt_visible_cores_is_refused_before_launch_naming_its_value(tmp_path, monkeypatch):
    from qwen3_pilot.tools.preflight import PreflightError
    from qwen3_pilot.trainer_run import TrainingError
    from qwen3_pilot.training import usable_backend

    with pytest.raises(PreflightError, match="NEURON_RT_VISIBLE_CORES='0-3' is set") as raised:
        printed_launches(monkeypatch, tmp_path, NEURON_RT_VISIBLE_CORES="0-3")
    assert "unset NEURON_RT_VISIBLE_CORES" in str(raised.value)
    # The stages refuse it too, before torchrun starts (besides this machine having no devices).
    config = backend_config("neuron", 64, neuron=TRN2["neuron"])
    with pytest.raises(TrainingError, match="NEURON_RT_VISIBLE_CORES='0-3' is set"):
        usable_backend("train_native", config, str(tmp_path))
    monkeypatch.delenv("NEURON_RT_VISIBLE_CORES")
    assert "NEURON_RT_VISIBLE_CORES" not in make_backend(config, str(tmp_path)).unavailable_reason


@pytest.mark.parametrize("user_flags, launched", [
    (None, "--lnc=2"),
    ("--model-type=transformer -O1", "--model-type=transformer -O1 --lnc=2"),
    ("-O1 --lnc=2", "-O1 --lnc=2"),
    ("--lnc 2 -O1", "--lnc 2 -O1"),
    ("--logical-nc-config=2", "--logical-nc-config=2"),
], ids=["unset", "the_users_flags_kept", "the_same_lnc_not_repeated", "spaced", "long_form"])
def test_the_compiler_gets_the_configured_lnc_after_the_users_own_flags(tmp_path, monkeypatch, user_flags, launched):
    environ = {} if user_flags is None else {"NEURON_CC_FLAGS": user_flags}
    backend, launches = printed_launches(monkeypatch, tmp_path, **environ)
    assert {launch["env"]["NEURON_CC_FLAGS"] for launch in launches} == {launched}  # the stage process's too
    assert backend.device_process_env["NEURON_CC_FLAGS"] == launched


@pytest.mark.parametrize("user_flags, written", [("-O1 --lnc=1", "--lnc=1"), ("-lnc 1", "-lnc 1")])
def test_an_lnc_in_neuron_cc_flags_that_is_not_neuron_lnc_is_refused_naming_both(
    tmp_path, monkeypatch, user_flags, written
):
    from qwen3_pilot.tools.preflight import PreflightError

    with pytest.raises(PreflightError, match=f"NEURON_CC_FLAGS='{user_flags}' passes {written}, but neuron.lnc = 2"):
        printed_launches(monkeypatch, tmp_path, NEURON_CC_FLAGS=user_flags)
    backend = make_backend(backend_config("neuron", 64, neuron=TRN2["neuron"]), str(tmp_path))
    assert f"passes {written}, but neuron.lnc = 2" in backend.unavailable_reason


def test_torchneurons_compile_cache_lock_folder_is_in_the_projects_cache_not_tmp(tmp_path, monkeypatch):
    backend, launches = printed_launches(monkeypatch, tmp_path)
    for launch in launches:  # every rank's and the stage process's
        assert launch["env"]["TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR"] == str(tmp_path / "cache" / "neuron" /
                                                                         "neff-local-cache"), launch["launch"]
    # Beside the NEFF cache, and not a per-measurement cache folder of the benchmark (no copied locks).
    assert backend.device_process_env["TORCH_NEURONX_NEFF_CACHE_DIR"] == str(tmp_path / "cache" / "neuron" /
                                                                            "neff-cache")
    assert "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR" not in backend.compile_cache_vars


# ---- 7. pins ----


def test_nki_is_pinned_to_sdk_2_33s_and_not_to_the_recorded_sdk_2_32_images():
    from qwen3_pilot.backends.neuron.stack import read_release
    from qwen3_pilot.backends.neuron.stack.installed import release_pins

    pins = release_pins(read_release("2.33.0"))
    listed = dict(line.split() for line in recorded("pip-list.trn2-container.txt").splitlines() if line.strip())
    # The recorded image is SDK 2.32's (neuronx-cc 2.27): its nki 0.6 is not what 2.33's compiler goes with.
    assert listed["nki"].startswith("0.6.0") and not pins["nki"].admits(listed["nki"])
    assert pins["nki"].admits("0.7.0+31049202112.g85070674")


@pytest.mark.parametrize("release", ["2.33.0", "2.34.0"])
def test_the_system_record_reads_every_os_package_of_each_release(release):
    from qwen3_pilot.backends.neuron.stack import read_release

    assert set(NEURON_SYSTEM_PACKAGES) == set(read_release(release).os_packages)
    assert "aws-neuronx-tools" in NEURON_SYSTEM_PACKAGES  # provides neuron-ls


def test_the_os_packages_are_read_one_query_each_and_a_missing_one_is_not_found():
    from qwen3_pilot.backends.neuron.machine import ToolOutput, read_os_packages

    seen = []

    def run(command):
        seen.append(command)
        return ToolOutput(0, "2.35.30.0-1") if command[-1] == "aws-neuronx-runtime-lib" else ToolOutput(1, "", "no")

    versions = read_os_packages(["aws-neuronx-runtime-lib", "aws-neuronx-dkms"], run, lambda tool: "/usr/bin/" + tool)
    assert versions == {"aws-neuronx-runtime-lib": "2.35.30.0-1", "aws-neuronx-dkms": "not found"}
    assert seen == [["dpkg-query", "-W", "-f=${Version}", "aws-neuronx-runtime-lib"],
                    ["dpkg-query", "-W", "-f=${Version}", "aws-neuronx-dkms"]]


def test_the_conda_env_installs_exactly_the_neuron_pins():
    env = yaml.safe_load((PROJECT / "workflow" / "envs" / "neuron.yaml").read_text())
    (pip,) = [d["pip"] for d in env["dependencies"] if isinstance(d, dict)]
    assert "-r neuron.txt" in pip
    assert not [line for line in pip if "==" in line]  # no second copy of a pin that could drift


def test_the_nki_library_is_recorded_with_the_distribution_that_provides_it():
    from qwen3_pilot.backends.neuron.machine import NOT_FOUND, module_distribution

    assert module_distribution("nkilib", lambda: {}) == NOT_FOUND
    assert module_distribution("yaml", lambda: {"yaml": ["PyYAML"]}).startswith("PyYAML 6.")
