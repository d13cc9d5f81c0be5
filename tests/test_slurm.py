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

import pytest
from conftest import slurm_unavailable

from qwen3_pilot.stages import STAGES, UPSTREAM

pytestmark = [pytest.mark.e2e, pytest.mark.slurm]

# Rules the profile gives whole instances: exclusive, all of the node's memory, and their own time limits.
INSTANCE_TIME = {"verify_ranks": "01:00:00", "train_native": "04:00:00", "train_hf": "04:00:00",
                 "moe_reduced": "04:00:00", "benchmark": "08:00:00", "kernel_numerics": "01:00:00",
                 "export_reload": "01:00:00", "pin_env": "00:15:00"}
# The rules that run where Snakemake runs (`localrules` in rules/*.smk): work on records, a small download.
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
