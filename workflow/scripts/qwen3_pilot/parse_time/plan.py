"""The invocation's plan: the jobs Snakemake is about to run and its reason for each, recorded in Snakemake's own
process when the run starts (onstart, workflow/rules/common.smk), read by the report ("ran in this invocation, and
why": changes.stage_runs), removed when the run ends."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..artifacts import write_json
from ..paths import HERE

# Written when the invocation starts, removed when it ends, so that a report never takes an earlier
# invocation's plan for its own.
PLAN = HERE.plan


def record_plan(jobs: Iterable[tuple[str, dict[str, str], str]], started: str, path: Path = PLAN) -> dict[str, Any]:
    """Writes this invocation's planned jobs (rule, wildcards, Snakemake's reason) for the report."""
    plan = {"started": started, "jobs": [{"rule": rule, "wildcards": dict(wildcards), "reason": reason}
                                         for rule, wildcards, reason in jobs]}
    write_json(path, plan)
    return plan


def snakemake_plan(dag) -> list[tuple[str, dict[str, str], str]]:
    """The jobs Snakemake is about to run, with its reason for each: the one place that reads Snakemake's
    DAG (Workflow.dag, DAG.needrun_jobs and DAG.reason, the objects its own dry run prints from)."""
    return [(job.rule.name, dict(job.wildcards.items()), str(dag.reason(job))) for job in dag.needrun_jobs()]


def read_plan(path: Path = PLAN) -> dict[str, Any] | None:
    """This invocation's plan, or None when none was recorded (a run with --no-hooks) or the one on disk
    does not plan the report (then it is not the plan of the invocation that builds this report)."""
    if not path.is_file():
        return None
    plan = json.loads(path.read_text())
    return plan if any(job["rule"] == "report" for job in plan["jobs"]) else None
