"""Backends: what each one launches with, and the neuron topology rules, tested without the hardware."""

from __future__ import annotations

from qwen3_pilot.backends import cache_env, make_backend
from qwen3_pilot.backends.neuron import launcher_env, read_system_versions, unavailable_reason

NEURON = {"chips": 16, "cores_per_chip": 8, "lnc": 2, "hbm_per_chip_gib": 96}


def config(backend: str, ranks: int) -> dict:
    return {"backend": backend, "ranks": ranks, "neuron": dict(NEURON)}


def test_cpu_backend_uses_gloo_and_the_configured_ranks(tmp_path):
    backend = make_backend(config("cpu", 3), str(tmp_path))
    assert (backend.device_type, backend.dist_backend, backend.expected_ranks) == ("cpu", "gloo", 3)
    assert backend.unavailable_reason is None
    assert int(backend.launcher_env["OMP_NUM_THREADS"]) >= 1


def test_caches_stay_under_the_project(tmp_path):
    env = cache_env(str(tmp_path))
    for key in ("HF_HOME", "TORCHINDUCTOR_CACHE_DIR", "TMPDIR", "TRITON_CACHE_DIR"):
        assert env[key].startswith(str(tmp_path)), key


def test_neuron_expects_chips_times_cores_over_lnc(tmp_path):
    backend = make_backend(config("neuron", 64), str(tmp_path))
    assert backend.expected_ranks == 64
    assert (backend.device_type, backend.dist_backend) == ("neuron", "neuron")
    assert backend.device_for_local_rank(5) == "neuron:5"
    lnc1 = {**config("neuron", 128), "neuron": {**NEURON, "lnc": 1}}
    assert make_backend(lnc1, str(tmp_path)).expected_ranks == 128


def test_neuron_launcher_sets_both_lnc_variables_and_a_project_compile_cache(tmp_path):
    env = launcher_env(config("neuron", 64), str(tmp_path))
    assert env["NEURON_LOGICAL_NC_CONFIG"] == "2" and env["NEURON_RT_VIRTUAL_CORE_SIZE"] == "2"
    assert env["NEURON_COMPILE_CACHE_URL"].startswith(str(tmp_path))


def test_neuron_is_unavailable_without_the_devices():
    assert "no Neuron devices" in unavailable_reason([], 16)
    assert "found 8 Neuron devices, expected 16" in unavailable_reason([f"/dev/neuron{i}" for i in range(8)], 16)
    assert unavailable_reason([f"/dev/neuron{i}" for i in range(16)], 16) is None


def test_neuron_system_versions_come_from_dpkg_and_the_tools():
    answers = {
        ("dpkg-query", "aws-neuronx-dkms"): "2.24.7.0",
        ("dpkg-query", "aws-neuronx-runtime-lib"): "2.28.23.0-dc38b6d11",
        ("neuronx-cc", "--version"): "NeuronX Compiler version 2.21.33363.0+82129205",
        ("neuron-ls", "--json-output"): '[{"neuron_device": 0}, {"neuron_device": 1}]',
    }

    def fake_run(command):
        return answers.get((command[0], command[-1]), "")

    versions = read_system_versions(fake_run)
    assert versions["aws-neuronx-dkms"] == "2.24.7.0"
    assert versions["aws-neuronx-runtime-lib"] == "2.28.23.0-dc38b6d11"
    assert versions["aws-neuronx-collectives"] == "not found"
    assert versions["neuronx-cc"] == "NeuronX Compiler version 2.21.33363.0+82129205"
    assert versions["neuron_ls_devices"] == 2


def test_torchrun_command_launches_the_module_with_the_rank_count(tmp_path):
    backend = make_backend(config("neuron", 64), str(tmp_path))
    command = backend.torchrun_command("/usr/bin/python3", 64, "qwen3_pilot.rank_worker", ["--out", "x"])
    assert command[:4] == ["/usr/bin/python3", "-m", "torch.distributed.run", "--standalone"]
    assert "--nproc-per-node=64" in command
    assert command[-4:] == ["-m", "qwen3_pilot.rank_worker", "--out", "x"] or command[-3:] == ["qwen3_pilot.rank_worker", "--out", "x"]


def test_peak_flops_for_mfu_come_from_the_backend(tmp_path):
    neuron = make_backend(config("neuron", 64), str(tmp_path))
    assert neuron.peak_flops_per_rank == 158e12
    assert "158 TFLOPS per logical core" in neuron.peak_flops_source
    cpu = make_backend(config("cpu", 2), str(tmp_path))
    assert cpu.peak_flops_per_rank is None  # measured on each rank by verify_ranks
    assert "measured" in cpu.peak_flops_source


def test_cpu_peak_measurement_is_a_positive_rate():
    from qwen3_pilot.backends.cpu import measure_peak_flops

    assert 1e8 < measure_peak_flops(seconds=0.1) < 1e14
