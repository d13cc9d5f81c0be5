"""The archive: what a pilot run produced, copied to archive.destination (a local folder or an S3 bucket),
read back from there and compared, file by file, with the source's sha256.

Two steps, so that a later corruption at the destination is found by rerunning the read-back alone:
`copy_run` checks report.json's artifacts against their recorded digests (the chain of custody), then copies
the selection and records each file's sha256 at the source; `read_back` reads every recorded file back from
the destination, compares, and writes the archive manifest beside the files. Layout at the destination:
`<destination>/<run key>/<path in the workflow folder>`, with `<run key>/archive-manifest.json`.

Torch-free and boto3-free at import: an s3:// destination loads qwen3_pilot.archive.s3 (Snakemake's S3
storage plugin) when it is used. Credentials never pass through here: boto3 takes them from the usual AWS
environment variables and files, and nothing this module writes names them.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from ..artifacts import MISSING, now_iso, sha256_file, write_json
from ..audit import OUTSIDE, artifact_changes, outside_project
from ..problems import problem_list
from .destinations import open_destination
from .errors import ArchiveError
from .settings import CONNECTION_KEYS, tls_state, tls_warnings

log = logging.getLogger("qwen3_pilot")

MANIFEST = "archive-manifest.json"
MANIFEST_VERSION = "1.0.0"

# What an archive holds besides report.json's artifacts (always in it, wherever they lie), as paths in the
# workflow folder; a folder's files are taken whole. Chosen from a finished cpu run's tree.
SELECTED = (
    "results/report.html",
    "results/report.json",
    "results/*/summary.json",  # each stage's own record, the report's only source
    "results/pin_env/",  # the environment record: every pin's stamp and the environment summary
    "results/export_reload/",  # each recipe's Hugging Face export: safetensors, config.json, tokenizer
    "results/train_*/",  # the training runs: recipe and parity records, metrics, launch records, rank logs
    "results/moe_reduced/",
    "results/benchmark/",  # the benchmark's runs and their recipes
    "logs/",  # every job's log, failed jobs' kept logs included
    "benchmarks/",  # Snakemake's time and memory per job
    "signoffs/",  # when present: the sign-offs and the signed reports they keep
)
# Not selected: results/fetch_weights/checkpoint and results/fixture_checkpoint (the weights are the hub's
# at the recorded revision, or rebuilt from config; the files report.json lists are archived all the same),
# results/preflight (`make preflight`'s, not the run's), results/failures (earlier runs' failure records;
# this run's failures are in report.json), results/invocation.json (a running invocation's plan), .cache/.


def left_out(path: str) -> bool:
    """Files inside the selected folders that an archive leaves out (path: in the workflow folder)."""
    parts = PurePosixPath(path).parts
    return (
        # torchtitan's checkpoint folders: the weights the pilot delivers are results/export_reload's, and
        # the consolidated safetensors of the last step are among report.json's artifacts; `sharded/` is a
        # duplicate of them.
        "checkpoint" in parts[:-1]
        # compiler caches: machine-specific, rebuilt by the next run, and large on trn2 (NEFFs)
        or "compile_cache" in parts[:-1]
        # hidden: Snakemake's .snakemake_timestamp, half-written temp files and staging folders
        or any(part.startswith(".") for part in parts)
        # a launcher's process id, meaningless once the run has ended
        or parts[-1].endswith(".pid")
        # the archive's own logs and records (written while it runs)
        or path.startswith(("logs/archive/", "results/archive/"))
    )


# --- what is archived -----------------------------------------------------------------------------------


def run_key(report: dict[str, Any], report_sha256: str) -> str:
    """The run's folder at the destination: when the run started and report.json's digest, so that two runs
    (or two reports of one run) never overwrite each other: 20261203T140146Z-1a2b3c4d5e6f."""
    started = report.get("provenance", {}).get("started") or ""
    digest = report_sha256[:12]
    if not started:
        return f"unstarted-{digest}"
    moment = datetime.fromisoformat(started)
    if moment.utcoffset() is not None:
        return f"{moment.astimezone(UTC):%Y%m%dT%H%M%SZ}-{digest}"
    return f"{moment:%Y%m%dT%H%M%S}-{digest}"


def _escape(name: str, target: str, root: Path) -> str:
    return f"{name} -> {target}: resolves outside the project {root}"


def select_files(root: Path, report: dict[str, Any]) -> list[str]:
    """Every file the archive copies, as sorted paths in the workflow folder `root`: SELECTED without what
    `left_out` names, and every artifact report.json lists (under the path it resolves to). Raises ArchiveError,
    before any file is read, naming each of them that resolves outside `root` and where it points."""
    # The rule: a file is the project's when its real path lies inside the workflow folder, however it is
    # reached; the real path is what decides, so a symbolic link at any level, `..` and an absolute path are
    # one case. A link that stays inside is taken as a file: its content under the link's own path, with that
    # content's sha256 in the manifest; it names a project file twice, and refusing it would fail a run for
    # nothing. A link that leads out (results/x/creds.txt -> ~/.aws/credentials) is refused, the whole archive
    # with it: no file of it is read or copied. Links to folders are not followed (Path.rglob), but one that
    # leads out is refused all the same, rather than its files silently missing from the archive.
    root = Path(root)
    escapes, chosen = [], set()
    for stage in report["stages"]:
        for artifact in stage.get("artifacts", []):
            target = outside_project(artifact["path"], root)
            if target is not None:
                escapes.append(_escape(f"{artifact['path']} (listed in report.json by {stage['stage']})", target,
                                       root))
                continue
            path = Path(artifact["path"])
            chosen.add((path if path.is_absolute() else root / path).resolve().relative_to(root.resolve()).as_posix())
    for pattern in SELECTED:
        for match in sorted(root.glob(pattern.rstrip("/"))):
            files = sorted(match.rglob("*")) if pattern.endswith("/") else [match]
            for path in files:
                relative = path.relative_to(root).as_posix()
                if left_out(relative) or not (path.is_file() or path.is_symlink()):
                    continue
                target = outside_project(relative, root)
                if target is not None:
                    escapes.append(_escape(relative, target, root))
                elif path.is_file():
                    chosen.add(relative)
    if escapes:
        raise ArchiveError(problem_list(
            f"nothing copied: {len(escapes)} path(s) of the archive resolve outside the project (through a symbolic "
            "link, `..` or an absolute path); the archive copies the project's own files only", escapes))
    return sorted(chosen)


def custody_check(report: dict[str, Any], root: Path) -> None:
    """Before anything is copied: every artifact report.json lists must still have the sha256 it recorded
    (audit.artifact_changes, the check `make verify` makes); an archive of changed files would certify them."""
    changes = artifact_changes(report, root)
    if changes:
        raise ArchiveError(problem_list(
            "nothing copied: files changed since their stage recorded them in report.json (chain of custody)",
            (_escape(f"{c['path']} ({c['stage']})", c["target"], root) if c["now"] == OUTSIDE
             else f"{c['path']} ({c['stage']}): report.json recorded sha256 {c['recorded']}, the file now has "
             f"{c['now']}"
             for c in changes)))


# --- the two steps --------------------------------------------------------------------------------------


def copy_run(settings: dict[str, Any], report_json: Path, scratch: Path) -> dict[str, Any]:
    """Refuses any path that leads out of the project (select_files), checks custody, copies the selection to
    the destination and returns the copy record: the destination, the run key, the TLS state and each file's
    size and sha256 at the source (read_back's input)."""
    # The workflow folder is report.json's folder's parent, not its real path's: a report.json that is a link
    # out of the project is refused here, unread.
    root = Path(report_json).absolute().parent.parent.resolve()
    target = outside_project(report_json, root)
    if target is not None:
        raise ArchiveError(f"nothing copied: {_escape(str(report_json), target, root)}")
    report = json.loads(Path(report_json).read_text())
    report_sha256 = sha256_file(report_json)
    files = select_files(root, report)  # first: refuses any path that leads out of the project, unread
    custody_check(report, root)
    key = run_key(report, report_sha256)
    destination = open_destination(settings, key, root, scratch)
    destination.check()
    log.info("archiving %d files of run %s to %s", len(files), key, destination.url)
    copied = []
    for path in files:
        target = outside_project(path, root)  # checked again just before it is read: a link changed meanwhile
        if target is not None:
            raise ArchiveError(f"copying stopped: {_escape(path, target, root)} (changed during the archive)")
        source = (root / path).resolve()  # read where the check found it
        entry = {"path": path, "bytes": source.stat().st_size, "sha256_source": sha256_file(source)}
        destination.put(source, path)
        log.info("copied %s (%d bytes, sha256 %s)", path, entry["bytes"], entry["sha256_source"])
        copied.append(entry)
    return {
        "run_key": key,
        "url": destination.url,
        "settings": {k: settings.get(k) for k in CONNECTION_KEYS},
        "tls": tls_state(settings),
        "warnings": tls_warnings(settings),
        "report": report_facts(report, report_sha256),
        "copied": now_iso(),
        "files": copied,
    }


def report_facts(report: dict[str, Any], report_sha256: str) -> dict[str, Any]:
    provenance = report.get("provenance", {})
    return {
        "sha256": report_sha256,
        "status": report.get("status"),
        "failed_run": report.get("failed_run", False),
        **{k: provenance.get(k) for k in ("started", "ended", "commit", "dirty", "config_digest")},
    }


def compare(files: list[dict[str, Any]], read: dict[str, tuple[str, int | None]], url: str) -> list[str]:
    """Each file whose read-back sha256 is not the source's, or that is missing at the destination, named with
    both digests."""
    problems = []
    for entry in files:
        digest, _ = read[entry["path"]]
        if digest == MISSING:
            problems.append(f"{entry['path']}: missing at {url} (sha256 at source {entry['sha256_source']})")
        elif digest != entry["sha256_source"]:
            problems.append(f"{entry['path']}: sha256 at source {entry['sha256_source']}, read back from {url} "
                            f"{digest}")
    return problems


def build_manifest(
    record: dict[str, Any], read: dict[str, tuple[str, int | None]], problems: list[str]
) -> dict[str, Any]:
    files = [{"path": e["path"], "bytes": e["bytes"], "sha256_source": e["sha256_source"],
              "sha256_read_back": read[e["path"]][0], "bytes_read_back": read[e["path"]][1]}
             for e in record["files"]]
    return {
        "manifest_version": MANIFEST_VERSION,
        "status": "fail" if problems else "pass",
        "problems": problems,
        "run_key": record["run_key"],
        "destination": record["url"],
        "tls": record["tls"],
        "warnings": record["warnings"],
        "report": record["report"],
        "copied": record["copied"],
        "read_back": now_iso(),
        "totals": {"files": len(files), "bytes": sum(f["bytes"] for f in files)},
        "files": files,
    }


def read_back(record: dict[str, Any], manifest_path: Path, scratch: Path, workflow_dir: Path) -> dict[str, Any]:
    """Reads every recorded file back from the destination and compares its sha256 with the source's, then
    writes the manifest locally and beside the files (so that an earlier manifest there never vouches for
    files that changed since). Raises ArchiveError naming every missing or different file; on a full match,
    reads the manifest back too."""
    settings = record["settings"]
    destination = open_destination(settings, record["run_key"], workflow_dir, scratch)
    destination.check()
    read = {}
    for entry in record["files"]:
        read[entry["path"]] = destination.read_back(entry["path"])
        log.info("read back %s: sha256 %s", entry["path"], read[entry["path"]][0])
    problems = compare(record["files"], read, destination.url)
    for problem in problems:
        log.error(problem)
    manifest = build_manifest(record, read, problems)
    write_json(manifest_path, manifest)
    destination.put(manifest_path, MANIFEST)
    if problems:
        raise ArchiveError(problem_list(f"{len(problems)} of {len(record['files'])} files at {destination.url} are "
                                        f"not the ones copied (its {MANIFEST} says so)", problems))
    local, remote = sha256_file(manifest_path), destination.read_back(MANIFEST)[0]
    if remote != local:
        raise ArchiveError(f"{MANIFEST}: sha256 written {local}, read back from {destination.url} {remote}")
    log.info("all %d files read back from %s with their source's sha256; manifest %s (sha256 %s)",
             len(record["files"]), destination.url, MANIFEST, local)
    return manifest
