"""More than one node, for real: two hosts made as network namespaces on this machine (a veth pair between
them, each with its own hostname and address), one gloo rank on each, torchrun's c10d rendezvous over the
veth addresses. The rank check and a short native training run go through the code the stages launch with
(backends' multi-node torchrun command, launch.run_torchrun); tests/multinode/two_hosts.sh stands in for
`srun --ntasks-per-node=1`, which starts the same command once on every node of an allocation.

Needs root (ip netns, nsenter, unshare): skipped without it, unless REQUIRE_MULTINODE is set (.ci/run sets it).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import PROJECT, SMALL, backend_config, default_config, output, run_snakemake, skip_or_fail

from qwen3_pilot.backends import make_backend
from qwen3_pilot.ranks import verify_ranks

pytestmark = [pytest.mark.e2e, pytest.mark.netns, pytest.mark.torchrun]

HOSTS = {"qwen3-pilot-ha": "10.77.0.1", "qwen3-pilot-hb": "10.77.0.2"}
INTERFACE = "pilot0"  # the veth end's name inside each namespace: one GLOO_SOCKET_IFNAME for both hosts
LAUNCHER = PROJECT / "tests" / "multinode" / "two_hosts.sh"


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def remove_hosts() -> None:
    for host in HOSTS:
        subprocess.run(["ip", "netns", "delete", host], capture_output=True)


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
    missing = [tool for tool in ("ip", "nsenter", "unshare") if shutil.which(tool) is None]
    if os.geteuid() != 0 or missing:
        skip_or_fail("REQUIRE_MULTINODE", "needs root and ip, nsenter, unshare "
                                          f"(missing: {', '.join(missing) or 'none'}; uid {os.geteuid()})")
    remove_hosts()
    (a, a_addr), (b, b_addr) = HOSTS.items()
    for host in HOSTS:
        ip("netns", "add", host)
        ip("-n", host, "link", "set", "lo", "up")
    ip("link", "add", "qp-veth-a", "type", "veth", "peer", "name", "qp-veth-b")
    for end, host, address in (("qp-veth-a", a, a_addr), ("qp-veth-b", b, b_addr)):
        ip("link", "set", end, "netns", host)
        ip("-n", host, "link", "set", end, "name", INTERFACE)
        ip("-n", host, "addr", "add", f"{address}/24", "dev", INTERFACE)
        ip("-n", host, "link", "set", INTERFACE, "up")
    hosts_file = tmp_path_factory.mktemp("hosts") / "hosts"
    hosts_file.write_text("127.0.0.1 localhost\n" + "".join(f"{addr} {host}\n" for host, addr in HOSTS.items()))
    yield {
        "QWEN3_PILOT_TEST_HOSTS": " ".join(HOSTS),
        "QWEN3_PILOT_TEST_HOSTS_FILE": str(hosts_file),
        # gloo binds to the veth address, not to what the (shared) hostname resolves to elsewhere.
        "GLOO_SOCKET_IFNAME": INTERFACE,
    }
    remove_hosts()


def two_node_backend(tmp_path: Path, port: int):
    config = backend_config("cpu", 1, nodes=2, multi_node={
        "launcher": [str(LAUNCHER)], "rdzv_host": HOSTS["qwen3-pilot-ha"], "rdzv_port": port,
    })
    return config, make_backend(config, str(tmp_path / "cache"))


def test_the_rank_check_sees_world_size_two_across_two_hosts(two_hosts, tmp_path):
    """The hosts' variables reach the launch through the backend's launcher environment, not os.environ: the
    shared run, started in another thread, copies os.environ for its Snakemake (and every job it starts),
    and a rank of its given GLOO_SOCKET_IFNAME=pilot0 would find no such interface."""
    _, backend = two_node_backend(tmp_path, 29511)
    backend = dataclasses.replace(backend, launcher_env={**backend.launcher_env, **two_hosts})
    assert backend.unavailable_reason is None and backend.expected_ranks == 2
    live = verify_ranks(backend, tmp_path / "ranks", tmp_path / "verify_ranks.log")
    assert (live["expected_ranks"], live["ranks_seen"], live["nodes"], live["ranks_per_node"]) == (2, 2, 2, 1)
    assert live["hosts"] == sorted(HOSTS), live
    assert live["all_reduce_sum"] == 3.0  # 1 + 2: both ranks' values crossed the veth
    log = (tmp_path / "verify_ranks.log").read_text()
    assert f"{LAUNCHER} " in log and "--nnodes=2" in log and "--rdzv-endpoint=10.77.0.1:29511" in log


def test_a_native_training_run_spans_the_two_hosts(two_hosts, trained_run, tmp_path):
    """The native recipe's trainer launch as the stage makes it (training.trainer_run, launch_and_read), over both
    hosts: the stage's random-init control is the same launcher with another recipe (the shared run has it). The
    hosts' variables reach the launch as its own environment, not os.environ: started_ahead bodies relaunch
    meanwhile, and a rank of theirs given GLOO_SOCKET_IFNAME=pilot0 would find no such interface."""
    from qwen3_pilot.recipe_registry import recipe_of
    from qwen3_pilot.training import launch_and_read, ranks_peak_flops, trainer_run

    config = default_config(SMALL, {"nodes": 2, "ranks": 1})
    _, backend = two_node_backend(tmp_path, 29512)
    results = trained_run / "results"
    out = tmp_path / "train_native"
    trainer = trainer_run(
        stage="train_native", backend=backend, checkpoint=results / "fetch_weights" / "checkpoint",
        corpus_dir=results / "fetch_corpus" / "c4_test", dataset=config["data"]["dataset"],
        training={**config["training"], "steps": 3},
        peak_flops_per_rank=ranks_peak_flops(results / "verify_ranks" / "measured.json"),  # as the stages read it
        parity_path=out / "parity.json",
    )
    launch, steps = launch_and_read("train_native", backend, trainer,
                                    config_function=recipe_of("train_native").config_function,
                                    recipe_path=out / "recipe.json", run_dir=out / "run",
                                    log_path=tmp_path / "train_native.log", extra_env=two_hosts)
    assert [step["step"] for step in steps] == [1, 2, 3] and backend.expected_ranks == 2
    assert config["training"]["global_batch_size"] == 2  # one sequence per rank, over both nodes
    recorded = (out / "run" / "launch.json").read_text()
    assert "--nnodes=2" in recorded and "--nproc-per-node=1" in recorded and str(LAUNCHER) in recorded
    # Each host's torchrun agent kept its own folder of rank logs (<run id>_<random>/attempt_0/<local rank>) and
    # started one local rank; the two ranks were global ranks 0 and 1.
    agents = list(Path(launch.rank_log_dir).iterdir())
    assert len(agents) == 2 and all([p.name for p in (a / "attempt_0").iterdir()] == ["0"] for a in agents), agents
    assert sorted(p.name.split(".")[1] for p in (out / "run" / "structured_logs").glob("*.jsonl")) == [
        "global_rank_0", "global_rank_1"]


def test_a_dry_run_for_two_trn2_nodes_shows_each_torchrun_stage_launching_on_both(workspace, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    result = run_snakemake(workspace(), "-n", "-p", "results/report.html", "--configfile", "config/trn2.yaml",
                           "--config", "nodes=2")
    assert result.returncode == 0, output(result)[-3000:]
    text = output(result)
    for stage, module in (("verify_ranks", "rank_worker"), ("train_native", "train_entry"), ("train_hf", "train_entry"),
                          ("moe_reduced", "train_entry"), ("benchmark", "train_entry")):
        assert (f"{stage} on 2 nodes x 64 ranks, launched from the first node of the job's allocation: "
                "srun --ntasks-per-node=1 --kill-on-bad-exit=1 python -m torch.distributed.run --nnodes=2 "
                "--rdzv-backend=c10d --rdzv-endpoint=<first node of the SLURM allocation>:29500") in text, stage
        assert f"--nproc-per-node=64 -m qwen3_pilot.titan.in_ranks.{module}" in text
