"""What changed since a baseline: which stages this invocation ran and why (Snakemake's own plan and rerun
reasons, recorded by parse_time/plan.py), which figures moved against a baseline report.json and by how much,
and how the environment and config differ. Torch-free; the report stage calls it.

The baseline is config `report.baseline` (a report.json) or else the report of the last approving sign-off,
read from the copy `make signoff` keeps beside the sign-offs and used only when its sha256 is the one the
sign-off recorded.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from .artifacts import current_sha256
from .stages import stage_of_job

# Figures measured from the clock, throughput or memory, and those derived from them, move on every rerun of
# the same software: they are timing figures, listed apart so that a moved loss or count is not lost among
# them; the rest are stable (the same software and config give the same value).
TIMING, STABLE = "timing", "stable"

# A stage without a table below: a figure whose name carries a unit of time or speed is timing.
TIMING_BY_NAME = re.compile(r"(_s|_us|seconds|mfu_pct|tflops|flops_per_rank|gbps)(_|$)")

# A stage whose figures' names do not all say what they measure (a spread `cv`, a `noisy` flag, a cost
# `warmup`) names each figure's kind, by its name without record labels (figure_name: the path
# `table[recipe=moe_reduced,run=eager].cv` is named `table.cv`). A test checks that every figure the stage
# records is in its table.
FIGURE_KINDS: dict[str, dict[str, str]] = {
    "benchmark": {
        # Settings and counts: what was measured, not how fast.
        **dict.fromkeys(("warmup_steps", "measured_steps", "ranks", "compile_backend", "peak_flops_source",
                         "table.steady_steps", "cost.price_per_hour", "noisy_cv", "eager_compiles",
                         "projection.basis"), STABLE),
        # The price as configured: what it is, where and when it was read.
        **dict.fromkeys(("price." + key for key in ("per_hour", "currency", "kind", "region", "as_of", "source")),
                        STABLE),
        # The sentences written instead of a table when no recipe compiles, replaces kernels, has a price or a
        # budget to project.
        **dict.fromkeys(("compile", "kernels", "cost", "price", "projection"), STABLE),
        # cpu: the slowest rank's matmul throughput, measured in verify_ranks (neuron: a published constant).
        "peak_flops_per_rank": TIMING,
        **dict.fromkeys(("table." + column for column in (
            "time_to_step1_s", "warmup_steps_s", "warmup_phase_s", "median_step_s", "p10_s", "p90_s", "cv",
            "noisy", "tokens_per_s_per_rank", "tokens_per_s_per_instance", "tflops_per_rank", "mfu_pct",
            "peak_memory_gib_per_rank", "data_wait_pct", "launch_wall_s")), TIMING),
        **dict.fromkeys(("compile." + column for column in (
            "compile_cost_at_step1_s", "cache_saving_at_step1_s", "warm_below_cold", "steady_gain_per_step_s",
            "steady_gain_relative", "time_to_step1_s_cold", "time_to_step1_s_warm")), TIMING),
        **dict.fromkeys(("kernels." + column for column in (
            "median_step_s_replaced", "median_step_s_plain", "step_time_relative", "peak_memory_gib_replaced",
            "peak_memory_gib_plain")), TIMING),
        # At a fixed price, the cost of a million tokens and of the warm-up are throughput and time.
        **dict.fromkeys(("cost.per_million_tokens", "cost.warmup", "cost.tokens_per_unit_price"), TIMING),
        # The projected full run follows the measured rate.
        **dict.fromkeys(("projection.rows." + column for column in (
            "wall_time_h", "wall_time_days", "instance_hours", "cost")), TIMING),
    },
}

# Figures left out of the comparison: the raw per-step times (runs x steps rows) would bury the rest, and
# the table's statistics of them (median, p10, p90, cv, warm-up steps) are compared.
NOT_COMPARED: dict[str, tuple[str, ...]] = {"benchmark": ("step_times",)}

# What names a record inside a list of records (a step, a numerics row, a parity field): the path of
# `steps[3].loss` reads `steps[step=4].loss`, which stays the same when a list gains or loses rows.
RECORD_KEYS = (
    "recipe", "run", "step", "layer", "package", "field", "section", "op", "dtype", "shape", "kernel", "module",
    "scaling_efficiency", "collective", "size_mib",
)


REUSED_BY_CONTENT = "reused: inputs unchanged by content"


def stage_runs(plan: dict[str, Any] | None, stages: list[dict[str, Any]]) -> dict[str, Any]:
    """Per stage: ran in this invocation (with Snakemake's reasons) or reused from an earlier one."""
    if plan is None:
        return {"recorded": False, "stages": {}, "ran": [], "reused": [],
                "note": "Snakemake's plan of this invocation was not recorded (run with --no-hooks?): which "
                        "stages ran and why is unknown."}
    reasons: dict[str, list[str]] = {}
    for job in plan["jobs"]:
        stage = stage_of_job(job["rule"], job["wildcards"])
        label = job["rule"] + "".join(f"[{value}]" for value in job["wildcards"].values())
        reasons.setdefault(stage, []).append(f"{label}: {job['reason']}")
    runs = {}
    for stage in stages:
        name = stage["stage"]
        if name in reasons and stage.get("started", plan["started"]) < plan["started"]:
            # Planned, yet its record predates this invocation: Snakemake planned it again once the checkpoint
            # it reads (fetch_weights) had run, and found its inputs byte-identical to its last run's.
            runs[name] = {"ran": False, "reasons": [
                f"{REUSED_BY_CONTENT} (planned at the start on: {'; '.join(reasons[name])})"]}
        elif name in reasons:
            runs[name] = {"ran": True, "reasons": reasons[name]}
        elif stage["status"] != "not_run":
            runs[name] = {"ran": False, "reasons": ["reused: Snakemake found its outputs up to date"]}
    return {
        "recorded": True,
        "started": plan["started"],
        "stages": runs,
        "ran": [name for name, run in runs.items() if run["ran"]],
        "reused": [name for name, run in runs.items() if not run["ran"]],
    }


def _label(record: dict[str, Any], index: int) -> str:
    keys = [key for key in RECORD_KEYS if key in record]
    if not keys:
        return str(index)
    return ",".join(f"{key}={json.dumps(record[key]) if isinstance(record[key], list) else record[key]}"
                    for key in keys)


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Leaf figures by path. Records in a list are named by their identifying keys (RECORD_KEYS); a list of
    plain values (a shape, tokens per expert) is one figure."""
    if isinstance(value, dict):
        leaves: dict[str, Any] = {}
        for key, item in value.items():
            leaves.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return leaves
    if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        leaves, seen = {}, set()
        for index, item in enumerate(value):
            label = _label(item, index)
            label = label if label not in seen else f"{label},#{index}"
            seen.add(label)
            # The identifying keys are in the label; they are not figures of their own.
            leaves.update(flatten({k: v for k, v in item.items() if k not in RECORD_KEYS}, f"{prefix}[{label}]"))
        return leaves
    return {prefix: value}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# A record label, one level of brackets inside it allowed (`shape=[2, 256]`).
RECORD_LABEL = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]")


def figure_name(path: str) -> str:
    """A figure's path without its record labels: the name of that column in every record."""
    return RECORD_LABEL.sub("", path)


def figure_kind(stage: str | None, path: str) -> str:
    """TIMING or STABLE: from the stage's table (FIGURE_KINDS) where it names the figure, else by its name."""
    kind = FIGURE_KINDS.get(stage or "", {}).get(figure_name(path))
    if kind is not None:
        return kind
    return TIMING if any(TIMING_BY_NAME.search(part) for part in re.split(r"[.\[\]]", path)) else STABLE


def compared(stage: str | None, figures: dict[str, Any]) -> dict[str, Any]:
    """The figures a comparison reads: all but the stage's NOT_COMPARED ones."""
    return {key: value for key, value in figures.items() if key not in NOT_COMPARED.get(stage or "", ())}


def figure_changes(before: dict[str, Any], now: dict[str, Any], stage: str | None = None) -> list[dict[str, Any]]:
    """Every figure that differs: numbers with their change and relative change, other values as they were
    and are; added and removed figures too. Largest relative change first. A figure present on one side only
    is never a timing: the set of things measured changed (a run added, a recipe dropped)."""
    old, new = flatten(compared(stage, before)), flatten(compared(stage, now))
    changes = []
    for path in sorted(old.keys() | new.keys()):
        a, b = old.get(path, "(absent)"), new.get(path, "(absent)")
        if a == b or (_is_number(a) and _is_number(b) and math.isnan(a) and math.isnan(b)):
            continue
        timing = path in old and path in new and figure_kind(stage, path) == TIMING
        change: dict[str, Any] = {"figure": path, "before": a, "now": b, "volatile": timing}
        if _is_number(a) and _is_number(b):
            change["change"] = b - a
            change["relative"] = (b - a) / abs(a) if a else None
        changes.append(change)
    return sorted(changes, key=lambda c: -abs(c["relative"]) if c.get("relative") is not None else -math.inf)


def environment_changes(before: dict[str, Any], now: dict[str, Any]) -> list[dict[str, Any]]:
    """Pinned and installed versions, Python and platform, and the backend's system versions that differ."""
    def rows(environment: dict[str, Any]) -> dict[str, Any]:
        facts = {f"{p['package']} (pinned)": p["pinned"] for p in environment.get("packages", [])}
        facts |= {f"{p['package']} (installed)": p["installed"] for p in environment.get("packages", [])}
        facts |= {key: value for key, value in environment.get("environment", {}).items()}
        facts |= {f"system: {key}": value for key, value in flatten(environment.get("system", {})).items() if key}
        if sdk := environment.get("neuron_sdk"):  # the neuron backend's release and each component's version in it
            facts["Neuron SDK"] = sdk["sdk_release"]
            facts |= {f"Neuron SDK component {row['component']}": row["release"] for row in sdk["components"]}
        return facts
    old, new = rows(before), rows(now)
    return [{"what": key, "before": old.get(key, "(absent)"), "now": new.get(key, "(absent)")}
            for key in sorted(old.keys() | new.keys()) if old.get(key) != new.get(key)]


def sdk_release_change(before: dict[str, Any], now: dict[str, Any]) -> str | None:
    """'Neuron SDK 2.33.0 -> 2.34.0 (torch-neuronx 2.14.3.0.* -> 2.14.3.1.*, ...)' when the two environments ran
    different Neuron SDK releases; None otherwise (the cpu backend has none)."""
    old, new = before.get("neuron_sdk"), now.get("neuron_sdk")
    if not old or not new or old["sdk_release"] == new["sdk_release"]:
        return None
    versions = {row["component"]: row["release"] for row in old["components"]}
    moved = [f"{row['component']} {versions.get(row['component'], '(absent)')} -> {row['release']}"
             for row in new["components"] if versions.get(row["component"]) != row["release"]]
    return (f"Neuron SDK {old['sdk_release']} -> {new['sdk_release']}"
            + (f" ({', '.join(moved)})" if moved else " (no component's version moved)"))


def code_changed(before: dict[str, Any], now: dict[str, Any]) -> bool | None:
    """Whether the code that made a stage's record (its digest, and a judged stage's measuring job's) differs
    from the baseline's; None where either side recorded none (a stage that did not run, an older report)."""
    def digests(code: dict[str, Any]) -> tuple[str | None, str | None]:
        return code.get("digest"), code.get("measured", {}).get("digest")

    if not before.get("digest") or not now.get("digest"):
        return None
    return digests(before) != digests(now)


def baseline_changes(report: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
    """This report against the baseline report: per stage, its status before and now, the figures that
    moved and the artifacts whose sha256 changed; the environment, config and provenance differences."""
    before = {stage["stage"]: stage for stage in baseline["stages"]}
    stages = {}
    for stage in report["stages"]:
        old = before.get(stage["stage"], {"status": "(absent)", "figures": {}, "artifacts": []})
        moved = figure_changes(old["figures"], stage["figures"], stage["stage"])
        old_digests = {a["path"]: a["sha256"] for a in old.get("artifacts", [])}
        changed = [a["path"] for a in stage.get("artifacts", []) if old_digests.get(a["path"]) != a["sha256"]]
        stages[stage["stage"]] = {
            "status_before": old["status"], "status_now": stage["status"],
            "figures_moved": [c for c in moved if not c["volatile"]],
            "timing_figures_moved": [c for c in moved if c["volatile"]],
            "artifacts_changed": changed,
            "code_changed": code_changed(old.get("code", {}), stage.get("code", {})),
        }
    return {
        "stages": stages,
        "environment": environment_changes(baseline.get("environment", {}), report.get("environment", {})),
        "neuron_sdk": sdk_release_change(baseline.get("environment", {}), report.get("environment", {})),
        "config": [{"what": c["figure"], "before": c["before"], "now": c["now"]}
                   for c in figure_changes(baseline.get("config", {}), report.get("config", {}))],
        "provenance": [{"what": key, "before": baseline["provenance"].get(key), "now": report["provenance"].get(key)}
                       for key in ("commit", "dirty", "config_digest")
                       if baseline["provenance"].get(key) != report["provenance"].get(key)],
    }


class BaselineError(ValueError):
    pass


def find_baseline(
    configured: str | None, workflow_dir: Path, signoffs: Path, backend: str
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(the baseline report, where it came from), or None when there is none: config `report.baseline`
    when set (parse_time.config holds it to this run's backend), else the copy of the report that the last
    approving sign-off of a run on `backend` was given to. A copy whose sha256 is not the one its sign-off
    recorded is not used: that is an error naming both digests."""
    if configured:
        path = Path(configured) if Path(configured).is_absolute() else workflow_dir / configured
        if not path.is_file():
            raise BaselineError(f"config report.baseline: {path} is not a file (expected a report.json)")
        return json.loads(path.read_text()), {"source": "config report.baseline", "path": str(path),
                                              "sha256": current_sha256(path)}
    from .audit import read_signoffs, signoff_backend

    approvals = [record for record in read_signoffs(signoffs)
                 if record["decision"] == "approve" and signoff_backend(record, signoffs) == backend]
    if not approvals:
        return None
    record = approvals[-1]
    copy = signoffs.parent / f"{record['report_sha256']}.json"
    digest = current_sha256(copy)
    if digest != record["report_sha256"]:
        raise BaselineError(f"{copy}: the signed-off report's copy has sha256 {digest}, its sign-off in "
                            f"{signoffs} recorded {record['report_sha256']}; not used as the baseline")
    return json.loads(copy.read_text()), {
        "source": f"last approving sign-off ({record['name']}, {record['date']})", "path": str(copy),
        "sha256": digest, "signed_off": {key: record[key] for key in ("name", "date", "decision", "note")},
    }


def headline(runs: dict[str, Any], changes: dict[str, Any] | None, not_run: frozenset[str] = frozenset()) -> str:
    """One sentence a reviewer reads first: what reran, what was reused, which figures moved. A stage the plan
    ran that has no result (`not_run`: blocked by a failure) is said to have been planned, not run."""
    if not runs["recorded"]:
        parts = [runs["note"]]
    else:
        stages = [name for name in runs["ran"] if name != "report" and name not in not_run]
        parts = [f"{', '.join(stages) or 'no stage'} reran", f"{', '.join(runs['reused']) or 'nothing'} reused"]
        if planned := [name for name in runs["ran"] if name in not_run]:
            parts.append(f"{', '.join(planned)} planned but not run")
    if changes is None:
        parts.append("no baseline to compare figures with")
    else:
        if changes.get("neuron_sdk"):
            parts.append(changes["neuron_sdk"])
        moved = [f"{name} ({len(stage['figures_moved'])})" for name, stage in changes["stages"].items()
                 if stage["figures_moved"]]
        timing = [name for name, stage in changes["stages"].items() if stage["timing_figures_moved"]]
        if code := [name for name, stage in changes["stages"].items() if stage.get("code_changed")]:
            parts.append(f"the code changed of {', '.join(code)}")
        parts.append(f"figures moved in {', '.join(moved)}" if moved else "no figure moved apart from timings")
        if timing:
            parts.append(f"timings moved in {', '.join(timing)}")
    return "; ".join(parts) + "."


def changes_since_baseline(report: dict[str, Any], plan: dict[str, Any] | None, configured: str | None,
                           workflow_dir: Path, signoffs: Path, *, strict: bool = True) -> dict[str, Any]:
    """The report's `changes` section: this invocation's runs, and the comparison with the baseline. With
    strict=False (the failed-run report) a baseline that cannot be used is said instead of raised."""
    runs = stage_runs(plan, report["stages"])
    not_run = frozenset(stage["stage"] for stage in report["stages"] if stage["status"] == "not_run")
    try:
        found = find_baseline(configured, workflow_dir, signoffs, report["backend"])
    except BaselineError as error:
        if strict:
            raise
        return {"headline": f"{headline(runs, None, not_run)} The baseline was not used: {error}", "invocation": runs,
                "baseline": None, "against_baseline": None}
    changes = baseline_changes(report, found[0]) if found else None
    return {
        "headline": headline(runs, changes, not_run),
        "invocation": runs,
        "baseline": found[1] if found else None,
        "against_baseline": changes,
    }
