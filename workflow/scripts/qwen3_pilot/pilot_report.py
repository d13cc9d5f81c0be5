"""The pilot's report (what stage report writes): results/report.json and results/report.html, built from the
stage summaries only."""

from __future__ import annotations

import json
import os
import socket
from datetime import datetime
from pathlib import Path
from typing import Any

from .artifacts import now_iso, record_digest, write_recorded_json, write_text
from .audit import default_signoffs, record_written_report
from .parse_time.code import git_provenance
from .paths import WORKFLOW
from .stages import STAGES, downstream_of, skipped_stages

NO_SUMMARY = "no summary of this stage among the report's inputs"

# report.json's shape; the report is checked against it before it is written.
REPORT_SCHEMA = WORKFLOW / "schemas" / "report.schema.json"
SCHEMA_VERSION = "1.2.0"
def titles(config: dict[str, Any]) -> dict[str, str]:
    """Each stage's title with the config's figures in it (steps, layers, experts)."""
    return {stage: title.format(**config) for stage, title in STAGES}


def report_heading(backend: str, stages: list[dict[str, Any]], failed_run: bool) -> tuple[str, str | None]:
    """(the page's title, its first line or None): what ran, as the backend words it (a CPU run says it is a
    rehearsal with stand-in models), and a failed run says so first."""
    from .backends import backend_module

    module = backend_module(backend)
    title = module.REPORT_TITLE
    caveat = module.report_caveat({stage["stage"]: stage.get("figures") or {} for stage in stages})
    return (f"FAILED RUN: {title} (not a finished pilot)" if failed_run else title), caveat


def failed_ancestor(stage: str, failed: set[str]) -> str | None:
    """The first stage, in the pilot's order, among `failed` that `stage` depends on, directly or not."""
    return next((name for name, _ in STAGES if name in failed and stage in downstream_of(name)), None)


def failed_run_stages(
    results: Path, run_started: str, config: dict[str, Any], skipped: dict[str, str]
) -> list[dict[str, Any]]:
    """Each stage after a failed run: fail (its failure record from this run: the reason and what it
    measured), not_run when a stage it depends on failed in this run (whatever an earlier run left on disk),
    else its summary on disk, marked when it comes from an earlier run. A failure record from an earlier
    run that this run did not reach is not shown as this run's failure."""
    records = {p.stem: json.loads(p.read_text()) for p in (results / "failures").glob("*.json")}
    failed = {stage for stage, record in records.items() if record["ended"] >= run_started and stage not in skipped}
    backend, stages = config["backend"], []
    for stage, title in titles(config).items():
        blocker = failed_ancestor(stage, failed)
        summary = results / stage / "summary.json"
        if stage in failed:
            entry = {"title": title, **records[stage], "backend": backend}
        elif blocker:
            entry = not_run(stage, title, backend, f"blocked by {blocker}, which failed")
        elif stage in records and not summary.exists():
            entry = not_run(stage, title, backend, f"failed in an earlier run ({records[stage]['ended']}: "
                            f"{records[stage]['figures'].get('reason', '')}); this run did not reach it")
        elif summary.exists():
            entry = {"title": title, **json.loads(summary.read_text())}
            if entry["ended"] < run_started:
                entry["notes"] = [*entry["notes"], "from an earlier run: this run did not rerun it (not needed, "
                                  "or not reached before the failure)"]
        else:
            entry = not_run(stage, title, backend, skipped.get(stage, "not reached: the run stopped at a failure"))
        stages.append(entry)
    return stages


def not_run(stage: str, title: str, backend: str, reason: str) -> dict[str, Any]:
    return {
        "stage": stage, "title": title, "status": "not_run", "backend": backend, "figures": {},
        "proves": "Nothing: the stage did not run.", "does_not_prove": "Anything.", "artifacts": [],
        "notes": [reason], "started": "", "ended": "",
    }


def collect_stages(summaries: dict[str, Path], config: dict[str, Any], skipped: dict[str, str]) -> list[dict[str, Any]]:
    backend, stages = config["backend"], []
    for stage, title in titles(config).items():
        if stage in summaries:
            entry = json.loads(Path(summaries[stage]).read_text())
            if entry["stage"] != stage:
                raise ValueError(f"{summaries[stage]}: holds stage {entry['stage']!r}, expected {stage!r}")
            stages.append({"title": title, **entry})
        else:
            stages.append(not_run(stage, title, backend, skipped.get(stage, NO_SUMMARY)))
    return stages


def overall_status(stages: list[dict[str, Any]], optional: set[str]) -> str:
    statuses = {s["status"] for s in stages if s["stage"] not in optional or s["status"] != "not_run"}
    if "fail" in statuses:
        return "fail"
    return "incomplete" if "not_run" in statuses else "pass"


def build_failed_report(
    *, config: dict[str, Any], config_digest: str, workflow_dir: Path, results: Path, run_started: str,
) -> dict[str, Any]:
    """After a failed run (Snakemake's onerror): the same report from what is on disk, with the failed
    stages, the stages they blocked, and an overall fail; it can never read as a finished pilot."""
    skipped = skipped_stages(config)
    stages = failed_run_stages(results, run_started, config, skipped)
    paths = {"html_path": results / "report.html", "json_path": results / "report.json"}
    report = write_report(stages, config=config, config_digest=config_digest,
                          workflow_dir=workflow_dir, optional=set(skipped), failed_run=True, **paths)
    # Snakemake takes an existing report as done when its inputs are missing (it does not rebuild missing
    # intermediates of an existing target), so the next run would keep this report. Dated 1970, it is older
    # than the report's script and inputs: Snakemake's default rerun triggers (code, mtime) take it as out of
    # date, and the next run rebuilds what is missing and the report (an e2e test shows it). A run limited
    # to --rerun-triggers mtime may not: it compares checksums of inputs it has records for.
    for path in paths.values():
        os.utime(path, (0, 0))
    return report


def write_report(
    stages: list[dict[str, Any]], *, config: dict[str, Any], config_digest: str, workflow_dir: Path,
    html_path: Path, json_path: Path, optional: set[str], failed_run: bool = False,
) -> dict[str, Any]:
    for stage in stages:
        if stage["started"] and stage["ended"]:
            stage["duration_s"] = round((datetime.fromisoformat(stage["ended"])
                                         - datetime.fromisoformat(stage["started"])).total_seconds(), 3)
    started = min((s["started"] for s in stages if s["started"]), default="")
    pin_env = next((s for s in stages if s["stage"] == "pin_env" and s["status"] == "pass"), None)
    status = overall_status(stages, optional)
    title, caveat = report_heading(config["backend"], stages, failed_run)
    report = {
        "schema_version": SCHEMA_VERSION,
        "title": title,
        "caveat": caveat,
        # A failed run is a fail even where the failure left no stage record (a parse or scheduling error).
        "status": "fail" if failed_run else status,
        "failed_run": failed_run,
        "backend": config["backend"],
        "provenance": {
            **git_provenance(workflow_dir),
            "host": socket.gethostname(),
            "config_digest": config_digest,
            "started": started,
            "ended": now_iso(),
        },
        "environment": pin_env["figures"] if pin_env else {},
        "config": config,
        "stages": stages,
    }
    report["changes"] = report_changes(report, json_path, failed_run)
    check_schema(report)
    json_sha256 = write_recorded_json(json_path, report)
    write_text(html_path, render_html(report))
    html_sha256 = record_digest(html_path)  # the archive consumes both files
    # Recorded as the workflow's own: `verify` tells an edited report from a newer run's by this ledger.
    record_written_report(json_path, (json_sha256, html_sha256))
    return report


def check_schema(report: dict[str, Any]) -> None:
    """Raises naming the first key that breaks workflow/schemas/report.schema.json."""
    import jsonschema

    schema = json.loads(REPORT_SCHEMA.read_text())
    if schema["properties"]["schema_version"]["const"] != SCHEMA_VERSION:
        raise ValueError(f"{REPORT_SCHEMA}: describes schema_version "
                         f"{schema['properties']['schema_version']['const']}, the report writes {SCHEMA_VERSION}")
    try:
        jsonschema.validate(json.loads(json.dumps(report, default=str)), schema)
    except jsonschema.ValidationError as error:
        where = "/".join(str(part) for part in error.absolute_path) or "(top level)"
        raise ValueError(f"report.json does not match {REPORT_SCHEMA} at {where}: {error.message}") from None


def report_changes(report: dict[str, Any], json_path: Path, failed_run: bool) -> dict[str, Any]:
    """What this invocation ran and why, and what moved since the baseline (changes.py)."""
    from .changes import changes_since_baseline
    from .parse_time.plan import PLAN, read_plan

    return changes_since_baseline(
        report, read_plan(json_path.parent / PLAN.name), report["config"]["report"]["baseline"],
        json_path.resolve().parent.parent, default_signoffs(json_path), strict=not failed_run,
    )


# A stage's figures that are lists of records naming a recipe, shown on the page as one table per recipe
# (under a heading naming it) rather than one table with a recipe column.
PER_RECIPE: dict[str, tuple[str, ...]] = {"benchmark": ("table", "compile", "kernels", "cost")}


def by_recipe(figures: dict[str, Any], keys: list[str]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """The records of `keys` by recipe and then figure, each row without its recipe."""
    grouped: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for key in keys:
        for row in figures[key]:
            rest = {column: value for column, value in row.items() if column != "recipe"}
            grouped.setdefault(row["recipe"], {}).setdefault(key, []).append(rest)
    return grouped


def page_figures(stage: dict[str, Any], plotted: bool) -> dict[str, Any]:
    """A stage's figures as the page shows them (figure_view's tables): `per_recipe`, its PER_RECIPE records by
    recipe; `drawn`, the figures left to its plot (plots.DRAWN_IN_FULL) when it has one; `blocks`, the rest."""
    from .figure_view import blocks, is_records, label, records_block
    from .plots import DRAWN_IN_FULL

    figures = stage["figures"]
    drawn = [key for key in DRAWN_IN_FULL.get(stage["stage"], ()) if plotted and key in figures]
    grouped = [key for key in PER_RECIPE.get(stage["stage"], ())
               if is_records(figures.get(key)) and all("recipe" in row for row in figures[key])]
    per_recipe = {recipe: [records_block(label(key), rows) for key, rows in tables.items()]
                  for recipe, tables in by_recipe(figures, grouped).items()}
    return {"blocks": blocks({key: value for key, value in figures.items() if key not in drawn + grouped}),
            "per_recipe": per_recipe, "drawn": drawn}


def moved_cells(moved: dict[str, Any], which: str | None = None):
    """A moved figure's before and now (or its `which`, e.g. its change) as the page shows them."""
    from .figure_view import figure_path_text

    if which:
        return figure_path_text(moved["figure"], moved[which])
    return figure_path_text(moved["figure"], moved["before"]), figure_path_text(moved["figure"], moved["now"])


def environment():
    """The templates' jinja2 environment: autoescaped, strict, with the helpers the templates use."""
    import jinja2

    from .decisions import deciding_figure, duration, other_commits, preflight_figure
    from .figure_view import blocks, exact_text, is_records

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("qwen3_pilot", "templates"),
        autoescape=True,  # every value written into the page is escaped
        undefined=jinja2.StrictUndefined,
    )
    env.filters["exact"] = exact_text
    env.tests["records"] = is_records
    env.globals.update(deciding_figure=deciding_figure, duration=duration, preflight_figure=preflight_figure,
                       page_figures=page_figures, moved_cells=moved_cells, view=blocks, other_commits=other_commits)
    return env


def render_html(report: dict[str, Any]) -> str:
    from .changes import flatten
    from .plots import report_plots

    environment_rest = {key: value for key, value in report["environment"].items()
                        if key not in ("packages", "pins_file", "lock")}
    return environment().get_template("report.html.j2").render(
        report=report, plots=report_plots(report["stages"]), config_flat=flatten(report["config"]),
        failed=[stage["stage"] for stage in report["stages"] if stage["status"] == "fail"],
        environment_rest=environment_rest)
