"""The pilot through a real SLURM: Debian's slurm-wlm as a one-node cluster on loopback (tests/slurm/cluster.sh:
munge, slurmdbd on MariaDB, slurmctld, slurmd, in a network namespace of their own), on a copy of the shared run
(which itself runs with the local executor). Every stage's job carries the resources the profile gives its class
(a dry run through `--profile profiles/slurm`); a stage of each class runs as one SLURM job with those resources,
read back from SLURM's accounting, and a local rule as none; a training job cancelled with scancel ends with its
ranks.

Needs root (the daemons, apt when the packages are missing): skipped without it, unless REQUIRE_SLURM is set
(.ci/run sets it), which makes that a failure.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest
from conftest import (
    AHEAD_ENV,
    SACCT_FIELDS,
    SLURM_SNAKEMAKE,
    in_cluster,
    metric_lines,
    output,
    rank_processes,
    released_once_signalled,
    run_snakemake,
    skip_or_fail,
    slurm_cluster,
    slurm_unavailable,
    started_ahead,
    stopped,
    wait_for_ends,
    wait_for_steps,
)

from qwen3_pilot.stages import STAGES, UPSTREAM, stage_of_job
from qwen3_pilot.unlock import workflow_processes

pytestmark = [pytest.mark.e2e, pytest.mark.slurm]

# Rules the profile gives whole instances: exclusive, all of the node's memory, and their own time limits (minutes).
INSTANCE_MINUTES = {"verify_ranks": 60, "train_native": 240, "train_hf": 240, "moe_reduced": 240, "benchmark": 480,
                    "kernel_numerics": 60, "export_reload": 60, "pin_env": 15, "fail_fast": 60,
                    "convergence": 120}
# The rules that run where Snakemake runs (`localrules` in workflow/rules/*.smk): work on records, a small download.
LOCAL_RULES = {"fetch_corpus", "pin_package", "judge", "compare_recipes", "report"}
COMMENT = re.compile(r"rule_(?P<rule>[a-z_]+?)(?:_wildcards_(?P<wildcard>\S+))?")
# A stage of each resource class, run as SLURM jobs: the weights' download (small) and pin_env, which on a trn2
# records the instance's Neuron versions (an instance; the training job of the scancel is one too).
SLURM_STAGES = ("fetch_weights", "pin_env")
# What the run forces: the package stamps (a local rule, so none of them a SLURM job) rerun pin_env.
FORCED = ("pin_package", "fetch_weights")


def planned_resources(result: subprocess.CompletedProcess) -> dict[str, dict[str, str]]:
    """A dry run's jobs but the local rules' as {stage: its `resources:` line as {name: value}}."""
    resources, rule, wildcards = {}, None, {}
    for line in output(result).splitlines():
        if block := re.match(r"^(?:rule|checkpoint) (\w+):$", line):
            rule, wildcards = block.group(1), {}
        elif rule and line.strip().startswith("wildcards:"):
            wildcards = dict(pair.split("=", 1) for pair in line.split(":", 1)[1].strip().split(", "))
        elif rule and line.strip().startswith("resources:") and rule not in LOCAL_RULES | {"all"}:
            pairs = line.split(":", 1)[1].strip().split(", ")
            resources[stage_of_job(rule, wildcards)] = dict(pair.split("=", 1) for pair in pairs)
    return resources


def node_figures(node: str) -> tuple[int, str]:
    """The test node's CPUs and memory as SLURM allocates a whole node (`scontrol show node -o`)."""
    cpus = int(re.search(r"CPUTot=(\d+)", node).group(1))
    memory = int(re.search(r"RealMemory=(\d+)", node).group(1))
    return cpus, f"{memory}M"


def job_processes(ws) -> list[int]:
    """The workflow's processes in `ws` but the Snakemake that submits the jobs (the job's own Snakemake, its
    stage, torchrun, the ranks)."""
    return [pid for pid, command in workflow_processes(ws) if "snakemake_polling" not in command]


@started_ahead(once_trained=True)
def test_stages_run_as_slurm_jobs_with_the_profiles_resources_and_scancel_ends_a_training_job(copy_of_run, scratch):
    """On a copy of the shared run (its training stages done) and a test cluster of its own: every stage's job as
    the profile makes it (a dry run); the native training forced as a SLURM job and cancelled mid-training: the
    ranks end without another step, then every process of the job (its Snakemake, the stage, torchrun), and the
    job's log says the stage died of SLURM's SIGTERM (the submitting Snakemake is stopped by the test: on this
    cluster its SLURM plugin had not reported the cancelled job 2 minutes later); then the weights' download and
    pin_env through the profile, each one SLURM job with its class's resources in SLURM's accounting (the package
    stamps before pin_env, a local rule, none)."""
    if (reason := slurm_unavailable()) is not None:
        skip_or_fail("REQUIRE_SLURM", reason)
    planned = run_snakemake(copy_of_run, "--profile", "profiles/slurm", "-n", "--forceall", "results/report.html",
                            env=AHEAD_ENV)
    assert planned.returncode == 0, output(planned)[-3000:]
    resources = planned_resources(planned)
    # Every stage a SLURM job (but those whose jobs are all local rules: the corpus, the comparison, the report).
    assert set(resources) == {stage for stage, _ in STAGES if stage in UPSTREAM} - {"fetch_corpus", "compare_recipes"}
    for stage, asked in resources.items():
        figures = (asked["runtime"], asked["mem_mb"], asked.get("slurm_extra"))
        if stage in INSTANCE_MINUTES:
            assert figures == (str(INSTANCE_MINUTES[stage]), "0", "--exclusive"), (stage, asked)
        else:
            assert figures == ("30", "4000", None) and asked["cpus_per_task"] == "1", (stage, asked)

    with slurm_cluster(scratch / "slurm") as prefix:
        scancel_a_training_job(copy_of_run, prefix)
        # (--nolock: the Snakemake that submitted the cancelled job was stopped, its lock left. Forcing the
        # weights' download before the training would have rerun fail_fast: this copy has no Snakemake metadata,
        # so the manifest's new date, not its unchanged checksum, decides.)
        # The plugin's status query every second (tests/slurm/snakemake_polling.py), one job at a time.
        ran = in_cluster(prefix, sys.executable, str(SLURM_SNAKEMAKE), "--profile", "profiles/slurm", "--jobs", "1",
                         *(f"results/{stage}/summary.json" for stage in SLURM_STAGES), "--forcerun", *FORCED,
                         "--nolock", "--configfile", "config/test.yaml", cwd=copy_of_run, timeout=600, env=AHEAD_ENV)
        assert ran.returncode == 0, output(ran)[-6000:]
        assert "localrule pin_package:" in output(ran), output(ran)[-3000:]
        run_id = re.search(r"SLURM run ID: (\S+)", output(ran)).group(1)
        # The plugin names every job of a run by the run's id. sacct lists only jobs since midnight unless told a
        # start: a run that spans midnight would lose its earlier jobs.
        records = in_cluster(prefix, "sacct", "-X", "-n", "-P", "--starttime", "2000-01-01", "--name", run_id, "-o",
                             ",".join(SACCT_FIELDS))
        jobs = {}
        for line in records.stdout.splitlines():
            job = dict(zip(SACCT_FIELDS, line.split("|"), strict=True))
            match = COMMENT.fullmatch(job["Comment"])
            assert match, f"job {job['JobID']}: comment {job['Comment']!r} names no rule"
            jobs.setdefault(match["rule"], []).append(job)
        assert sorted(jobs) == sorted(SLURM_STAGES) and all(len(runs) == 1 for runs in jobs.values()), jobs
        cpus, memory = node_figures(in_cluster(prefix, "scontrol", "show", "node", "-o").stdout)
        (small,), (instance,) = jobs["fetch_weights"], jobs["pin_env"]
        for job in (small, instance):
            assert job["State"] == "COMPLETED" and job["NNodes"] == "1", job
        assert (small["AllocCPUS"], small["ReqMem"], small["Timelimit"]) == ("1", "4000M", "00:30:00"), small
        # --exclusive and no --mem: every CPU and all of the node's memory.
        assert (instance["AllocCPUS"], instance["ReqMem"], instance["Timelimit"]) == (str(cpus), memory,
                                                                                       "00:15:00"), instance


def scancel_a_training_job(copy_of_run, prefix) -> None:
    """The native training forced as a SLURM job through the profile, cancelled mid-training (scancel: a user's,
    or the job's time limit)."""
    run_dir = copy_of_run / "results" / "train_native" / "run"
    shutil.rmtree(run_dir)  # so that the metrics watched are the new run's
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
