"""Stage archive: the pilot's files copied to archive.destination (rule archive_copy), then read back from
there and compared with the source, with the manifest written beside them (rule archive)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

STAGE = "archive"


def run_copy(*, settings: dict[str, Any], report_json: Path, record_path: Path) -> dict[str, Any]:
    """Checks report.json's artifacts against their recorded digests, copies the selection, and writes the copy
    record (what went where, with each file's sha256 at the source) for the read-back."""
    from ..archive import ArchiveError, copy_run
    from ..artifacts import write_recorded_json
    from ..stage_progress import record_measured
    from ..unlock import refuse_while_running

    # A pipeline run in this folder (not the Snakemake this job runs under) may be rewriting what would be copied.
    busy = refuse_while_running(Path.cwd(), "the archive")
    if busy:
        raise ArchiveError(busy)
    record_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".scratch-", dir=record_path.parent) as scratch:
        record = copy_run(settings, report_json, Path(scratch))
    record_measured(run_key=record["run_key"], destination=record["url"], tls=record["tls"],
                    files=len(record["files"]))
    write_recorded_json(record_path, record)  # the read-back holds the record to this sha256
    return record


def run_read_back(*, copy_record: Path, manifest_path: Path, summary_path: Path) -> dict[str, Any]:
    """Reads every copied file back from the destination; the manifest (local copy and the one beside the
    files) and the stage summary on success, an error naming each missing or different file otherwise."""
    from ..archive import MANIFEST, read_back
    from ..stage_progress import record_measured
    from ..summary import StageSummary

    record = json.loads(copy_record.read_text())
    record_measured(run_key=record["run_key"], destination=record["url"], tls=record["tls"],
                    warnings=record["warnings"])
    workflow_dir = Path(copy_record).resolve().parents[2]  # results/archive/<record> -> the workflow folder
    with tempfile.TemporaryDirectory(prefix=".scratch-", dir=manifest_path.parent) as scratch:
        manifest = read_back(record, manifest_path, Path(scratch), workflow_dir)
    summary = StageSummary(
        stage=STAGE,
        status="pass",
        backend="",
        figures={
            "destination": record["url"],
            "run_key": record["run_key"],
            "tls": record["tls"],
            "files": manifest["totals"]["files"],
            "bytes": manifest["totals"]["bytes"],
            "report": record["report"],
            "manifest": f"{record['url']}/{MANIFEST}",
        },
        proves=f"Each of the {manifest['totals']['files']} files copied to {record['url']} was read back from "
        "there with the sha256 it had at the source, and every artifact report.json lists had the sha256 its "
        "stage recorded before the copy began.",
        does_not_prove="That the destination keeps them: later loss or corruption there shows only when the "
        "read-back runs again (`snakemake --cores 1 archive --forcerun archive`); nor anything about the files "
        "the archive leaves out (compiler caches, checkpoint folders, the fetched weights beyond the files "
        "report.json lists).",
        # The loud part first: a reader of the summary sees that TLS was not verified before anything else.
        notes=[*record["warnings"], (f"run key {record['run_key']}: report.json sha256 "
                                     f"{record['report']['sha256']}, status {record['report']['status']}")],
    )
    summary.add_artifacts([manifest_path])
    return summary.write(summary_path)
