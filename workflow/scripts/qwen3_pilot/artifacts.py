"""Atomic writes and checksums: nothing half-written is ever taken for a finished artifact."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from .problems import problem_list


def now_iso() -> str:
    """Now in UTC to the millisecond: the time format of every record the pilot writes."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")

def sha256_file(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def git_blob_sha1(path: Path) -> str:
    """The hash `git hash-object` prints, the hub's etag of a file not stored in LFS (such files are small:
    huggingface_hub reads them whole too). Imported here, not at parse time."""
    from huggingface_hub.utils.sha import git_hash

    return git_hash(Path(path).read_bytes())


def verify_checksum(path: Path, expected: str) -> str:
    """Checks a file against a 64-hex sha256 or a 40-hex git blob sha1 (the hub's two etag kinds)."""
    expected = expected.strip().lower()
    if len(expected) == 64:
        kind, actual = "sha256", sha256_file(path)
    elif len(expected) == 40:
        kind, actual = "git blob sha1", git_blob_sha1(path)
    else:
        raise ValueError(f"{path}: expected checksum {expected!r} is neither a sha256 nor a git sha1")
    if actual != expected:
        raise ChecksumError(f"{path}: {kind} mismatch: expected {expected}, got {actual}")
    return kind


class ChecksumError(RuntimeError):
    pass


def describe_artifact(path: Path, root: Path | None = None) -> dict[str, Any]:
    path = Path(path)
    shown = os.path.relpath(path, root) if root else str(path)
    return {"path": shown, "bytes": path.stat().st_size, "sha256": sha256_file(path)}


def write_json(path: Path, payload: Any) -> None:
    write_text(path, json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text(path: Path, text: str) -> None:
    """Writes to a temp file beside `path`, then renames it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a report is meant to be read by others
        os.replace(tmp, path)
    except BaseException as error:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(error, OSError) and error.filename is None:  # a full disk names no file: say which
            raise OSError(error.errno, f"writing {path}: {error.strerror}") from error
        raise


@contextlib.contextmanager
def staging_dir(final: Path) -> Iterator[Path]:
    """Yields an empty folder beside `final`; on success it replaces `final`, on error it is removed."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent))
    try:
        yield tmp
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


MISSING = "missing"


def current_sha256(path: Path) -> str:
    """The file's sha256 as it is now, or MISSING: what a recorded digest is compared with."""
    return sha256_file(path) if Path(path).is_file() else MISSING


class CustodyError(RuntimeError):
    pass


# A file whose producer is no stage summary's artifact (the summaries themselves, the pin stamps) has its
# sha256 recorded beside it, in `sha256sum -c` format, by the code that writes it.
DIGEST_SUFFIX = ".sha256"
RESULTS = "results"


def digest_path(path: Path) -> Path:
    return Path(path).with_name(Path(path).name + DIGEST_SUFFIX)


def record_digest(path: Path) -> str:
    """The finished file's sha256 beside it: what its consumers hold it to. Returns it."""
    digest = sha256_file(path)
    write_text(digest_path(path), f"{digest}  {Path(path).name}\n")
    return digest


def write_recorded_json(path: Path, payload: Any) -> str:
    write_json(path, payload)
    return record_digest(path)


def remove_recorded(path: Path) -> None:
    """A file written with its sha256 beside it, removed with it: a digest never outlives its file."""
    Path(path).unlink(missing_ok=True)
    digest_path(path).unlink(missing_ok=True)


def recorded_digest(path: Path) -> str | None:
    recorded = digest_path(path)
    return recorded.read_text().split()[0] if recorded.is_file() else None


# The records that vouch for other files (an `artifacts` list of path and sha256, and the `stage` that wrote
# them): a stage's summary, and a content record, which names files by content and nothing about the run that
# made them (fetch_weights' manifest.json: its consumers rerun only when its bytes change).
PRODUCER_RECORDS = ("summary.json", "manifest.json")


def custody_problems(consumed: Iterable[str | Path]) -> list[str]:
    """Chain of custody: each consumed file that a producing stage recorded must still have the sha256 it
    recorded. Producers are the records among `consumed` (a job's inputs; PRODUCER_RECORDS); a record's
    artifacts are checked where they are consumed files or lie in consumed folders. Every other consumed file
    under results/ (the records themselves, the pin stamps) is held to the sha256 recorded beside it, which
    must exist. Paths are the workflow folder's."""
    # Resolved, so that a producer that recorded absolute paths is held to its record as well.
    named = {Path(p).resolve(): str(p) for p in consumed}
    consumed = list(named)
    summaries = [p for p in consumed if p.name in PRODUCER_RECORDS]
    files = [p for p in consumed if p not in summaries]
    problems, covered = [], set()
    for summary_path in summaries:
        summary = json.loads(summary_path.read_text())
        for artifact in summary.get("artifacts", []):
            path = Path(artifact["path"]).resolve()
            if not any(path == f or f in path.parents for f in files):
                continue
            covered.add(path)
            now = current_sha256(path)
            if now != artifact["sha256"]:
                problems.append(f"{artifact['path']}: {summary['stage']} recorded sha256 {artifact['sha256']}, "
                                f"the file now has {now}")
    results = Path(RESULTS).resolve()
    for path in consumed:
        if path in covered or not path.is_file() or results not in path.parents:
            continue
        recorded = recorded_digest(path)
        if recorded is None:
            problems.append(f"{named[path]}: no sha256 recorded beside it ({digest_path(named[path])}): rerun "
                            "the stage that writes it")
        elif (now := sha256_file(path)) != recorded:
            problems.append(f"{named[path]}: its stage recorded sha256 {recorded}, the file now has {now}")
    return problems


def check_custody(consumed: Iterable[str | Path]) -> None:
    problems = custody_problems(consumed)
    if problems:
        raise CustodyError(
            problem_list("an input changed after the stage that produced it recorded it (chain of custody)", problems)
        )
