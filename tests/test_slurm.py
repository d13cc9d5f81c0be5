"""The pilot through a real SLURM: Debian's slurm-wlm as a one-node cluster on loopback (tests/slurm/cluster.sh:
munge, slurmdbd on MariaDB, slurmctld, slurmd, in a network namespace of their own), the small cpu config run
with `snakemake --profile profiles/slurm` to a passing report, and SLURM's accounting records read back: one
job per stage, each with the resources the profile asked for.

Needs root (the daemons, apt when the packages are missing): skipped without it, unless REQUIRE_SLURM is set
(.ci/run sets it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PROJECT, SMALL, make_workspace, output

from qwen3_pilot.report import STAGES, UPSTREAM

pytestmark = pytest.mark.e2e

CLUSTER = PROJECT / "tests" / "slurm" / "cluster.sh"
# Rules the profile gives whole instances: exclusive, all of the node's memory, and their own time limits.
INSTANCE_TIME = {"verify_ranks": "01:00:00", "train_native": "04:00:00", "train_hf": "04:00:00",
                 "moe_reduced": "04:00:00", "benchmark": "08:00:00", "kernel_numerics": "01:00:00",
                 "export_reload": "01:00:00", "pin_env": "00:15:00"}
COMMENT = re.compile(r"rule_(?P<rule>[a-z_]+?)(?:_wildcards_(?P<wildcard>\S+))?")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    if os.geteuid() != 0 or shutil.which("nsenter") is None:
        reason = f"needs root and nsenter to run the SLURM daemons (uid {os.geteuid()})"
        if os.environ.get("REQUIRE_SLURM"):
            pytest.fail(f"REQUIRE_SLURM is set: {reason}")
        pytest.skip(reason)
    state = tmp_path_factory.mktemp("slurm")
    started = subprocess.run([str(CLUSTER), "start", str(state)], capture_output=True, text=True, timeout=600)
    assert started.returncode == 0, output(started)[-4000:]
    values = dict(line.split("=", 1) for line in started.stdout.splitlines() if "=" in line)
    yield ["nsenter", f"--net=/run/netns/{values['NETNS']}"]
    subprocess.run([str(CLUSTER), "stop", str(state)], capture_output=True, timeout=120)


def in_cluster(slurm: list[str], *command: str, cwd: Path | None = None, timeout: float = 60):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run([*slurm, *command], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def node_figures(slurm) -> tuple[int, str]:
    """The test node's CPUs and memory as SLURM allocates a whole node."""
    node = in_cluster(slurm, "scontrol", "show", "node", "-o").stdout
    cpus = int(re.search(r"CPUTot=(\d+)", node).group(1))
    memory = int(re.search(r"RealMemory=(\d+)", node).group(1))
    return cpus, f"{memory}M"


def test_the_pilot_runs_through_the_slurm_executor_one_job_per_stage(slurm, tmp_path):
    # The e2e config without the benchmark's compiled runs: every stage still runs, in less CI time.
    ws = make_workspace(tmp_path / "ws", {**SMALL, "benchmark": {**SMALL["benchmark"], "compile_recipes": []}})
    result = in_cluster(slurm, sys.executable, "-m", "snakemake", "--profile", "profiles/slurm", "results/report.html",
                        "--configfile", "config/test.yaml", cwd=ws, timeout=1500)
    assert result.returncode == 0, output(result)[-8000:]
    report = json.loads((ws / "results" / "report.json").read_text())
    assert report["status"] == "pass", [(s["stage"], s["status"]) for s in report["stages"]]

    # SLURM's own records: this run's jobs (the plugin names every job of a run by the run's id).
    run_id = re.search(r"SLURM run ID: (\S+)", output(result)).group(1)
    records = in_cluster(slurm, "sacct", "-X", "-n", "-P", "--name", run_id,
                         "-o", "JobID,Comment,State,NNodes,AllocCPUS,ReqMem,Timelimit").stdout.splitlines()
    jobs: dict[str, list[dict[str, str]]] = {}
    for line in records:
        job_id, comment, state, nodes, cpus, memory, limit = line.split("|")
        match = COMMENT.fullmatch(comment)
        assert match, f"job {job_id}: comment {comment!r} names no rule"
        stage = match["wildcard"] if match["rule"] == "train" else match["rule"]
        jobs.setdefault(stage, []).append(
            {"id": job_id, "state": state, "nodes": nodes, "cpus": cpus, "memory": memory, "limit": limit})
    expected = {stage for stage, _ in STAGES if stage in UPSTREAM} | {"report"}
    assert set(jobs) == expected, sorted(jobs)
    assert {stage: len(runs) for stage, runs in jobs.items() if len(runs) != 1} == {}, "one SLURM job per stage"

    whole_node_cpus, whole_node_memory = node_figures(slurm)
    for stage, (job,) in jobs.items():
        assert job["state"] == "COMPLETED" and job["nodes"] == "1", (stage, job)
        if stage in INSTANCE_TIME:
            # --exclusive and no --mem: every CPU and all of the node's memory.
            assert (job["cpus"], job["memory"], job["limit"]) == (
                str(whole_node_cpus), whole_node_memory, INSTANCE_TIME[stage]), (stage, job)
        else:
            assert (job["cpus"], job["memory"], job["limit"]) == ("1", "4000M", "00:30:00"), (stage, job)
