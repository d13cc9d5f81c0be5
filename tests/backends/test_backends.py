"""Backends: what each one launches with, and the neuron topology rules, tested without the hardware."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import PROJECT, backend_config, default_config

from qwen3_pilot.backends import (
    BACKENDS,
    FIRST_NODE_OF_ALLOCATION,
    BackendModule,
    apply_device_process_env,
    backend_module,
    cache_env,
    collective_count_dtype,
    make_backend,
    multi_node_launch,
    rank_log_files,
)
from qwen3_pilot.backends.neuron import launcher_env, unavailable_reason
from qwen3_pilot.backends.neuron.machine import ToolOutput, read_system_versions

NEURON = {"chips": 16, "cores_per_chip": 8, "lnc": 2, "hbm_per_chip_gib": 96}


def config(backend: str, ranks: int) -> dict:
    return backend_config(backend, ranks, neuron=dict(NEURON))


@pytest.mark.parametrize("name", BACKENDS)
def test_each_backend_module_is_the_declared_interface_with_its_parameters(name):
    """What the ranks, the report and the parse-time check call by name on a backend's module: every member, each
    function taking exactly the declared parameters (a backend's own option would leak into every caller)."""
    import inspect

    module = backend_module(name)
    assert isinstance(module, BackendModule)
    for member, declared in vars(BackendModule).items():
        if callable(declared) and not member.startswith("_"):
            wanted = [p for p in inspect.signature(declared).parameters if p != "self"]
            got = [p for p, spec in inspect.signature(getattr(module, member)).parameters.items()
                   if spec.default is inspect.Parameter.empty]
            assert got == wanted, f"{name}.{member}{inspect.signature(getattr(module, member))}"


def test_cpu_backend_uses_gloo_and_the_configured_ranks(tmp_path):
    backend = make_backend(config("cpu", 3), str(tmp_path))
    assert (backend.device_type, backend.dist_backend, backend.expected_ranks) == ("cpu", "gloo", 3)
    assert backend.unavailable_reason is None
    assert int(backend.launcher_env["OMP_NUM_THREADS"]) >= 1


def test_a_cpu_rank_runs_its_share_of_the_cores_whatever_snakemake_set(tmp_path):
    """Snakemake gives a job's processes OMP/MKL/OPENBLAS... = the job's threads; each rank must still run
    cores / ranks threads, or the ranks oversubscribe the machine."""
    import os
    import subprocess
    import sys

    from qwen3_pilot.backends import threads_per_rank

    backend = make_backend(config("cpu", 2), str(tmp_path))
    job_env = {**os.environ, **dict.fromkeys(("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                               "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS"),
                                              "8")}
    result = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                            env={**job_env, **backend.launcher_env}, capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == str(threads_per_rank(2)), result.stderr


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


def test_neuron_launcher_sets_both_lnc_variables_and_a_project_compile_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("NEURON_CC_FLAGS", raising=False)
    env = launcher_env(config("neuron", 64), str(tmp_path))
    assert env["NEURON_LOGICAL_NC_CONFIG"] == "2" and env["NEURON_RT_VIRTUAL_CORE_SIZE"] == "2"
    # TorchNeuron's caches; the torch-xla path's variables would be ignored (and --cache_dir is no
    # neuronx-cc option), so a rerun would recompile every graph.
    for key in ("TORCH_NEURONX_NEFF_CACHE_DIR", "TORCH_NEURONX_DEBUG_DIR"):
        assert env[key].startswith(str(tmp_path)), key
    assert env["TORCH_NEURONX_NEFF_CACHE_DIR"] != env["TORCH_NEURONX_DEBUG_DIR"]
    assert "NEURON_COMPILE_CACHE_URL" not in env and env["NEURON_CC_FLAGS"] == "--lnc=2"  # the compiler's LNC


def test_a_users_neuron_cc_flags_reach_the_launch_with_the_lnc_after_them(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_CC_FLAGS", "--model-type=transformer -O1")
    backend = make_backend(config("neuron", 64), str(tmp_path))
    # How ranks.launch_ranks and training.launch build the ranks' environment.
    launched = {**os.environ, **backend.launcher_env}
    assert launched["NEURON_CC_FLAGS"] == "--model-type=transformer -O1 --lnc=2"


def test_a_stage_process_gets_the_device_part_of_the_ranks_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_CC_FLAGS", "-O1")
    neuron = make_backend({**config("neuron", 64), "nodes": 2}, str(tmp_path))
    # The same values the ranks get, without the launch-only parts (the EFA settings of a two-node launch, the
    # thread counts per rank).
    assert neuron.device_process_env == {key: neuron.launcher_env[key] for key in (
        "TORCH_NEURONX_NEFF_CACHE_DIR", "TORCH_NEURONX_DEBUG_DIR", "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR",
        "NEURON_LOGICAL_NC_CONFIG", "NEURON_RT_VIRTUAL_CORE_SIZE", "NEURON_CC_FLAGS")}
    assert "FI_PROVIDER" in neuron.launcher_env and "OMP_NUM_THREADS" in neuron.launcher_env
    environ = {"NEURON_LOGICAL_NC_CONFIG": "1", "NEURON_CC_FLAGS": "-O1"}
    assert apply_device_process_env(neuron, environ) == neuron.device_process_env
    # The config's LNC, for the runtime and after the user's flags for the compiler.
    assert environ == neuron.device_process_env and environ["NEURON_CC_FLAGS"] == "-O1 --lnc=2"
    # cpu: nothing beyond the compiler caches every stage process keeps in the project; no OMP_NUM_THREADS.
    cpu_environ: dict[str, str] = {}
    assert apply_device_process_env(make_backend(config("cpu", 2), str(tmp_path)), cpu_environ) == {} == cpu_environ


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
        answer = answers.get((command[0], command[-1]))
        return ToolOutput(0, answer) if answer is not None else ToolOutput(1, "", "not installed")

    versions = read_system_versions(fake_run, which={"dpkg-query": "/usr/bin/dpkg-query"}.get)
    assert versions["package_manager"] == "dpkg-query"
    assert versions["aws-neuronx-dkms"] == "2.24.7.0"
    assert versions["aws-neuronx-runtime-lib"] == "2.28.23.0-dc38b6d11"
    assert versions["aws-neuronx-collectives"] == "not found"
    assert versions["aws-neuronx-tools"] == "not found"
    assert versions["neuronx-cc"] == "2.21.33363.0+82129205"
    assert versions["neuron_ls_devices"] == 2


def test_torchrun_command_launches_the_module_with_the_rank_count(tmp_path):
    backend = make_backend(config("neuron", 64), str(tmp_path))
    command = backend.torchrun_command("/usr/bin/python3", 64, "qwen3_pilot.titan.in_ranks.rank_worker", ["--out", "x"])
    assert command[:4] == ["/usr/bin/python3", "-m", "torch.distributed.run", "--standalone"]
    assert "--nproc-per-node=64" in command
    assert command[-4:] == ["-m", "qwen3_pilot.titan.in_ranks.rank_worker", "--out", "x"]
    # Without a folder for per-rank logs, every rank prints to the console as before.
    assert not [a for a in command if a.startswith(("--log-dir", "--tee", "--redirects", "--local-ranks-filter"))]


def test_neuron_torchrun_keeps_rank_0_in_the_stage_log_and_every_rank_in_its_own_files(tmp_path):
    backend = make_backend(config("neuron", 64), str(tmp_path))
    ranks_dir = tmp_path / "logs" / "train_native" / "ranks"
    command = backend.torchrun_command(
        "python", 64, "qwen3_pilot.titan.in_ranks.train_entry", ["--config", "f"], rank_log_dir=ranks_dir
    )
    launcher = command[:command.index("-m", 3)]
    assert launcher == [
        "python", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=64",
        f"--log-dir={ranks_dir}", "--tee=3", "--local-ranks-filter=0",
    ]
    assert command[len(launcher):] == ["-m", "qwen3_pilot.titan.in_ranks.train_entry", "--config", "f"]


def test_cpu_torchrun_keeps_every_rank_on_the_console_and_its_error_files_in_the_log_dir(tmp_path):
    backend = make_backend(config("cpu", 2), str(tmp_path))
    command = backend.torchrun_command("python", 2, "m", [], rank_log_dir=tmp_path / "ranks")
    assert f"--log-dir={tmp_path / 'ranks'}" in command
    assert not [a for a in command if a.startswith(("--tee", "--redirects", "--local-ranks-filter"))]


@pytest.mark.torchrun
def test_the_installed_torchrun_writes_the_rank_logs_where_rank_log_files_finds_them(tmp_path):
    """The flags against torch.distributed.run itself: two ranks, only rank 0 on the console."""
    (tmp_path / "say_rank.py").write_text(
        "import os, sys\n"
        "print('stdout of rank', os.environ['RANK'])\n"
        "print('stderr of rank', os.environ['RANK'], file=sys.stderr)\n"
    )
    backend = dataclasses.replace(make_backend(config("cpu", 2), str(tmp_path)), console_local_ranks=(0,))
    command = backend.torchrun_command(sys.executable, 2, "say_rank", [], rank_log_dir=tmp_path / "ranks")
    env = {**os.environ, **backend.launcher_env, "PYTHONPATH": str(tmp_path)}
    Path(env["TMPDIR"]).mkdir(parents=True, exist_ok=True)
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    console = result.stdout + result.stderr
    assert "stdout of rank 0" in console and "stderr of rank 0" in console
    assert "of rank 1" not in console
    files = rank_log_files(tmp_path / "ranks")
    assert sorted(files) == [0, 1]
    for rank, streams in files.items():
        assert f"stdout of rank {rank}" in streams["stdout"].read_text()
        assert f"stderr of rank {rank}" in streams["stderr"].read_text()


def test_collective_counts_are_32_bit_on_every_backend():
    import torch

    # Neuron's collectives take no 64-bit types; gloo takes int32 too, so one dtype serves both.
    assert collective_count_dtype() == torch.int32


@pytest.fixture
def one_rank_group():
    """A gloo process group of one rank on an in-memory store: nothing listens on the network."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture
def sent_dtypes(monkeypatch):
    """The dtypes of every tensor that goes through all_reduce and all_gather, which still run."""
    import torch.distributed as dist

    sent: list[tuple[str, object]] = []
    all_reduce, all_gather = dist.all_reduce, dist.all_gather

    def recording_all_reduce(tensor, *args, **kwargs):
        sent.append(("all_reduce", tensor.dtype))
        return all_reduce(tensor, *args, **kwargs)

    def recording_all_gather(outputs, tensor, *args, **kwargs):
        sent.extend(("all_gather", t.dtype) for t in [*outputs, tensor])
        return all_gather(outputs, tensor, *args, **kwargs)

    monkeypatch.setattr(dist, "all_reduce", recording_all_reduce)
    monkeypatch.setattr(dist, "all_gather", recording_all_gather)
    return sent


def test_the_rank_workers_collectives_send_only_32_bit_types(one_rank_group, sent_dtypes):
    import torch

    from qwen3_pilot.titan.in_ranks.rank_worker import known_collectives

    seen = known_collectives(0, 1, torch.device("cpu"))
    assert seen == {"device": "cpu", "all_reduce_sum": 1.0, "all_gather": [0]}
    assert sent_dtypes == [("all_reduce", torch.float32), ("all_gather", torch.int32), ("all_gather", torch.int32)]


def test_the_router_load_goes_through_its_all_reduce_as_int32(one_rank_group, sent_dtypes, tmp_path, monkeypatch):
    import torch

    from qwen3_pilot.titan.in_ranks.titan_metrics import recording_router_load

    class Optimizers:
        def register_step_pre_hook(self, hook):
            self.hook = hook

    moe = torch.nn.Module()
    moe.register_buffer("tokens_per_expert_E", torch.tensor([3.0, 0.0, 5.0, 1.0]))  # float32, as torchtitan's
    moe.load_balance_coeff = None
    block = torch.nn.Module()
    block.moe_enabled, block.moe = True, moe
    part = torch.nn.Module()
    part.layers = torch.nn.ModuleDict({"0": block})
    optimizers = Optimizers()
    monkeypatch.setenv("RANK", "0")
    recording_router_load(None, str(tmp_path / "load.jsonl"))(optimizers, [part], parallel_dims=None)
    optimizers.hook()
    assert sent_dtypes == [("all_reduce", torch.int32)]
    assert (tmp_path / "load.jsonl").read_text() == '{"step": 1, "tokens_per_expert": [[3, 0, 5, 1]]}\n'
    assert moe.tokens_per_expert_E.sum() == 0  # no load-balancing hook zeroes them: the recorder does


def test_the_largest_count_sent_through_a_collective_fits_int32_at_trn2_scale():
    """The router load of one step summed over all ranks: global batch x seq_len x top_k tokens routed."""
    merged = default_config(yaml.safe_load((PROJECT / "config" / "trn2.yaml").read_text()))  # moe.top_k's default too
    routed = merged["training"]["global_batch_size"] * merged["training"]["seq_len"] * merged["moe"]["top_k"]
    assert routed < 2**31
    # float32 would be exact too (below 2**24): the counts' source buffer in torchtitan is float32.
    assert routed < 2**24


def test_peak_flops_for_mfu_come_from_the_backend(tmp_path):
    neuron = make_backend(config("neuron", 64), str(tmp_path))
    assert neuron.peak_flops_per_rank == 158e12
    assert "158 TFLOPS per logical core" in neuron.peak_flops_source
    cpu = make_backend(config("cpu", 2), str(tmp_path))
    assert cpu.peak_flops_per_rank is None  # measured on each rank by verify_ranks
    assert "measured" in cpu.peak_flops_source


def best_matmul_flops(size: int, calls: int, repeats: int) -> float:
    """The reference: float32 size x size torch.matmul, `calls` in a row timed as one block, the fastest of
    `repeats` blocks, at 2 size^3 FLOPs per call."""
    import time

    import torch

    a, b = torch.rand(size, size, dtype=torch.float32), torch.rand(size, size, dtype=torch.float32)
    torch.matmul(a, b)
    fastest = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            torch.matmul(a, b)
        fastest = min(fastest, time.perf_counter() - started)
    return 2 * size**3 * calls / fastest


@pytest.fixture
def one_torch_thread():
    """One thread for both measurements: with two threads on a machine another process also uses, each
    matmul waits for its slower thread. On the 2-core build machine with another pytest run going, the ratio
    measured/reference ranged 0.7-2.8 over four tries with two threads and 0.99-1.01 with one."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_cpu_peak_measurement_agrees_with_a_matmul_timed_here(one_torch_thread):
    """measure_peak_flops is MFU's denominator on cpu: it must be within 3x (either way) of a float32 matmul
    of the same size and threads timed independently here; a peak 10x off (a wrong FLOP count, a wrong
    unit) fails. No time limit: a ratio of two measurements."""
    from qwen3_pilot.backends.cpu import measure_peak_flops

    # Each the best of several, taken in turn, so that a busy moment of the machine slows neither one alone.
    measured, reference = 0.0, 0.0
    for _ in range(3):
        measured = max(measured, measure_peak_flops(size=512, seconds=0.2))
        reference = max(reference, best_matmul_flops(512, calls=10, repeats=3))
    assert reference / 3 < measured < reference * 3, f"measure_peak_flops {measured:.3g}, here {reference:.3g}"


# ---- more than one node ----

def two_nodes(backend: str = "cpu", ranks: int = 2, **multi_node) -> dict:
    settings = {**default_config()["multi_node"], **multi_node}
    return {**config(backend, ranks), "nodes": 2, "multi_node": settings}


def test_one_node_launches_torchrun_standalone_without_a_launcher(tmp_path):
    backend = make_backend(config("cpu", 2), str(tmp_path))
    command = backend.torchrun_command("python", 2, "some.module", ["--flag"])
    assert backend.multi_node is None
    assert command[:5] == ["python", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]


def test_two_nodes_run_srun_torchrun_with_a_c10d_rendezvous_on_the_first_node_of_the_allocation():
    # torchtitan's multinode_trainer.slurm: srun torchrun --nnodes N --rdzv_backend c10d --rdzv_endpoint <head>:port
    environ = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "trn2-[7-8]", "SLURM_JOB_NUM_NODES": "2"}
    expanded = []
    launch = multi_node_launch(two_nodes(), environ, hostnames=lambda nodelist: expanded.append(nodelist) or
                               ["trn2-7", "trn2-8"])
    assert expanded == ["trn2-[7-8]"] and launch.problem is None
    assert launch.torchrun_options() == [
        "--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=trn2-7:29500", "--rdzv-id=4242",
    ]
    backend = dataclasses.replace(make_backend(config("cpu", 2), "/cache"), multi_node=launch, expected_ranks=4)
    command = backend.torchrun_command("python", 2, "some.module", ["--flag"])
    assert command[:command.index("python")] == ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    assert "--standalone" not in command and "--nproc-per-node=2" in command
    assert command[-2:] == ["some.module", "--flag"]


def test_world_size_is_nodes_times_ranks_per_node_and_torchrun_starts_ranks_per_node(tmp_path):
    cpu = make_backend(two_nodes("cpu", 3, rdzv_host="10.0.0.1"), str(tmp_path))
    assert (cpu.ranks_per_node, cpu.expected_ranks) == (3, 6)
    assert "--rdzv-endpoint=10.0.0.1:29500" in cpu.torchrun_command("python", cpu.ranks_per_node, "m", [])
    neuron = make_backend({**two_nodes("neuron", 64, rdzv_host="10.0.0.1"), "neuron": dict(NEURON)}, str(tmp_path))
    assert (neuron.ranks_per_node, neuron.expected_ranks) == (64, 128)


def test_a_configured_rendezvous_host_and_port_need_no_slurm():
    launch = multi_node_launch(two_nodes(rdzv_host="10.0.0.1", rdzv_port=29600), environ={})
    assert launch.problem is None and launch.endpoint == "10.0.0.1:29600" and launch.rdzv_id == "qwen3-pilot"


def test_outside_an_allocation_the_multi_node_launch_says_what_is_missing_but_is_still_built():
    launch = multi_node_launch(two_nodes(), environ={})
    assert launch.endpoint == f"{FIRST_NODE_OF_ALLOCATION}:29500"
    assert "multi_node.rdzv_host = null" in launch.problem and "SLURM_JOB_NODELIST is unset" in launch.problem


def test_an_allocation_of_another_size_is_refused_before_any_launch():
    launch = multi_node_launch(two_nodes(), {"SLURM_JOB_NODELIST": "a", "SLURM_JOB_NUM_NODES": "1"},
                               hostnames=lambda nodelist: ["a"])
    assert launch.problem.startswith("nodes = 2, but this SLURM allocation has 1 node(s)")


def test_the_backend_cannot_run_a_multi_node_launch_outside_an_allocation(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    monkeypatch.delenv("SLURM_JOB_NUM_NODES", raising=False)
    monkeypatch.delenv("SLURM_NNODES", raising=False)
    backend = make_backend(two_nodes(), str(tmp_path))
    assert "SLURM_JOB_NODELIST is unset" in backend.unavailable_reason


def test_neuron_on_two_nodes_adds_the_efa_settings_but_keeps_the_users(tmp_path):
    trn2_two = {**two_nodes("neuron", 64), "neuron": dict(NEURON)}
    env = launcher_env(trn2_two, str(tmp_path), environ={"FI_EFA_FORK_SAFE": "0"})
    assert env["FI_PROVIDER"] == "efa" and env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert "FI_EFA_FORK_SAFE" not in env  # the user's own value reaches the ranks from the environment
    # TorchNeuron derives the runtime's root communicator from MASTER_ADDR (global rank 0's host).
    assert "NEURON_RT_ROOT_COMM_ID" not in env
    assert not {"FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA"} & set(launcher_env(config("neuron", 64), str(tmp_path)))
