"""The pilot through a real SLURM: the shared end-to-end run (conftest.pipeline_run) goes through
`snakemake --profile profiles/slurm` on Debian's slurm-wlm as a one-node cluster on loopback
(tests/slurm/cluster.sh: munge, slurmdbd on MariaDB, slurmctld, slurmd, in a network namespace of their own)
wherever the cluster can run, and SLURM's accounting records of that run are read back here: one job per stage
(but the local rules), each with the resources the profile asked for. Every other end-to-end test reads the same run.

Needs root (the daemons, apt when the packages are missing): the shared run is local and this test skips
without it, unless REQUIRE_SLURM is set (.ci/run sets it), which makes that a failure.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest
from conftest import (
    AHEAD_ENV,
    SLURM_SNAKEMAKE,
    in_cluster,
    metric_lines,
    output,
    rank_processes,
    released_once_signalled,
    slurm_cluster,
    slurm_unavailable,
    started_ahead,
    stopped,
    wait_for_ends,
    wait_for_steps,
)

from qwen3_pilot.stages import STAGES, UPSTREAM
from qwen3_pilot.unlock import workflow_processes

pytestmark = [pytest.mark.e2e, pytest.mark.slurm]

# Rules the profile gives whole instances: exclusive, all of the node's memory, and their own time limits.
INSTANCE_TIME = {"verify_ranks": "01:00:00", "train_native": "04:00:00", "train_hf": "04:00:00",
                 "moe_reduced": "04:00:00", "benchmark": "08:00:00", "kernel_numerics": "01:00:00",
                 "export_reload": "01:00:00", "pin_env": "00:15:00"}
# The rules that run where Snakemake runs (`localrules` in workflow/rules/*.smk): work on records, a small download.
LOCAL_STAGES = {"fetch_corpus", "compare_recipes", "report"}
COMMENT = re.compile(r"rule_(?P<rule>[a-z_]+?)(?:_wildcards_(?P<wildcard>\S+))?")


@pytest.fixture(scope="module")
def slurm_run(pipeline_run):
    # Under REQUIRE_SLURM a shared run that could not go through SLURM has failed already (make_pipeline_run).
    if pipeline_run.slurm_jobs is None:
        pytest.skip(slurm_unavailable() or "the shared run did not go through SLURM")
    return pipeline_run


def node_figures(node: str) -> tuple[int, str]:
    """The test node's CPUs and memory as SLURM allocates a whole node (`scontrol show node -o`)."""
    cpus = int(re.search(r"CPUTot=(\d+)", node).group(1))
    memory = int(re.search(r"RealMemory=(\d+)", node).group(1))
    return cpus, f"{memory}M"


def test_the_pilot_runs_through_the_slurm_executor_one_job_per_stage(slurm_run):
    report = json.loads((slurm_run.workspace / "results" / "report.json").read_text())
    assert report["status"] == "pass", [(s["stage"], s["status"]) for s in report["stages"]]

    # SLURM's own records of this run's jobs.
    jobs: dict[str, list[dict[str, str]]] = {}
    for record in slurm_run.slurm_jobs:
        match = COMMENT.fullmatch(record["Comment"])
        assert match, f"job {record['JobID']}: comment {record['Comment']!r} names no rule"
        stage = match["wildcard"] if match["rule"] == "train" else match["rule"]
        jobs.setdefault(stage, []).append(record)
    expected = ({stage for stage, _ in STAGES if stage in UPSTREAM} | {"report"}) - LOCAL_STAGES
    assert set(jobs) == expected, sorted(jobs)
    assert {stage: len(runs) for stage, runs in jobs.items() if len(runs) != 1} == {}, "one SLURM job per stage"

    whole_node_cpus, whole_node_memory = node_figures(slurm_run.slurm_node)
    for stage, (job,) in jobs.items():
        figures = (job["AllocCPUS"], job["ReqMem"], job["Timelimit"])
        assert job["State"] == "COMPLETED" and job["NNodes"] == "1", (stage, job)
        if stage in INSTANCE_TIME:
            # --exclusive and no --mem: every CPU and all of the node's memory.
            assert figures == (str(whole_node_cpus), whole_node_memory, INSTANCE_TIME[stage]), (stage, job)
        else:
            assert figures == ("1", "4000M", "00:30:00"), (stage, job)


def job_processes(ws) -> list[int]:
    """The workflow's processes in `ws` but the Snakemake that submits the jobs (the job's own Snakemake, its
    stage, torchrun, the ranks)."""
    return [pid for pid, command in workflow_processes(ws) if "snakemake_polling" not in command]


@started_ahead
def test_scancel_of_a_training_job_ends_the_stage_torchrun_and_every_rank(copy_of_run, scratch):
    """SLURM's own cancellation (scancel: a user's, or the job's time limit) reaches the ranks: a copy of the
    shared run on a test cluster of its own, its native training forced as a SLURM job through the profile and
    cancelled mid-training: the ranks end without another step, then every process of the job (its Snakemake,
    the stage, torchrun), and the job's log says the stage died of SLURM's SIGTERM. (The
    submitting Snakemake is stopped by the test: on this cluster its SLURM plugin had not reported the cancelled
    job 2 minutes later.)"""
    if slurm_unavailable() is not None:
        pytest.skip(slurm_unavailable())
    run_dir = copy_of_run / "results" / "train_native" / "run"
    shutil.rmtree(run_dir)  # so that the metrics watched are the new run's
    with slurm_cluster(scratch / "slurm") as prefix:
        snakemake = subprocess.Popen(
            [*prefix, sys.executable, str(SLURM_SNAKEMAKE), "--profile", "profiles/slurm", "--jobs", "1",
             "results/train_native/summary.json", "--forcerun", "train", "--configfile", "config/test.yaml"],
            cwd=copy_of_run, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=AHEAD_ENV)
        try:
            wait_for_steps(snakemake, run_dir, 1)
            ranks = rank_processes(copy_of_run)
            assert len(ranks) == 2, "no rank found while training"
            # The ranks stopped mid-training: a step can follow the scancel only if no signal reaches them (how
            # long a loaded machine takes to end them decides nothing). SLURM itself resumes a job's stopped
            # processes (SIGCONT) right before its SIGTERM, one signal loop apart, far less than a step.
            stopped(ranks)
            steps_logged = metric_lines(run_dir)
            jobs = in_cluster(prefix, "squeue", "-h", "-o", "%i").stdout.split()
            assert len(jobs) == 1, jobs
            cancelled = in_cluster(prefix, "scancel", jobs[0])
            assert cancelled.returncode == 0, output(cancelled)
            released_once_signalled(ranks)
            # No step after the scancel (the job's Snakemake may since have removed the failed job's run folder).
            assert metric_lines(run_dir) <= steps_logged < 10, "the ranks trained on after the scancel"
            # Then every process of the job (its Snakemake, the stage, torchrun), SIGKILLed at the latest after
            # SLURM's KillWait.
            wait_for_ends(job_processes(copy_of_run))
        finally:
            snakemake.kill()
            snakemake.communicate(timeout=60)
    (job_log,) = (copy_of_run / ".snakemake" / "slurm_logs" / "rule_train" / "train_native").glob("*.log")
    assert "train.py' died with <Signals.SIGTERM: 15>" in job_log.read_text(), job_log.read_text()[-3000:]
