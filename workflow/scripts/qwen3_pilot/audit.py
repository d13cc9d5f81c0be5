"""`make verify` and `make signoff`: every artifact the report lists re-checked against the files on disk,
and a reviewer's decision recorded with the sha256 of the report.json it was made on.

    python -m qwen3_pilot.audit verify [--report results/report.json]
    python -m qwen3_pilot.audit signoff --name NAME --decision approve|reject [--note TEXT]

Sign-offs live in signoffs/signoffs.jsonl, outside results/, so that `make clean` and reruns leave them;
the report never fills them in itself (a report that held its own sign-off would change the digest the
sign-off is bound to). Beside them, signoffs/reports_written.jsonl lists the digests of every report the
workflow wrote: `verify` fails on a signed report that changed into one the workflow never wrote (edited), and
lists a sign-off whose report a newer run replaced (the signed report is kept beside the sign-offs); only a
report the workflow wrote can be approved.
Torch-free.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from .artifacts import current_sha256, now_iso
from .paths import HERE

DEFAULT_REPORT = HERE.report_json
SIGNOFFS = Path("signoffs") / "signoffs.jsonl"
# Next to the sign-offs: one line per report.json/report.html pair the report stage (or the failed-run report)
# wrote. Judging an edit by the fields inside the report would trust the file under suspicion.
REPORTS_WRITTEN = "reports_written.jsonl"
DECISIONS = ("approve", "reject")


class SignoffError(ValueError):
    pass


# An artifact's "now" when its path resolves outside the workflow folder: never read, so no digest.
OUTSIDE = "outside the project"


def outside_project(path: str | Path, root: Path) -> str | None:
    """Where `path` really points, when that lies outside the workflow folder `root` (through a symbolic link
    at any level, `..` or an absolute path; a relative path is `root`'s), else None. The real path decides:
    `make verify` reads, and the archive copies, the project's own files only."""
    base = Path(root).resolve()
    path = Path(path)
    try:
        real = (path if path.is_absolute() else base / path).resolve()
    except (OSError, RuntimeError):  # a symbolic link loop (RuntimeError on Python 3.11)
        return "a symbolic link loop"
    return None if real == base or base in real.parents else str(real)


def artifact_changes(report: dict[str, Any], root: Path) -> list[dict[str, str]]:
    """Every artifact in the report whose file is missing or whose sha256 is not the recorded one; relative
    paths are the workflow folder's (`root`). One that resolves outside `root` is never read: its "now" is
    OUTSIDE, with "target", where it points."""
    changes = []
    for stage in report["stages"]:
        for artifact in stage.get("artifacts", []):
            target = outside_project(artifact["path"], root)
            if target is not None:
                changes.append({"stage": stage["stage"], "path": artifact["path"], "recorded": artifact["sha256"],
                                "now": OUTSIDE, "target": target})
                continue
            path = Path(artifact["path"])
            path = path if path.is_absolute() else root / path
            now = current_sha256(path)
            if now != artifact["sha256"]:
                changes.append({"stage": stage["stage"], "path": artifact["path"], "recorded": artifact["sha256"],
                                "now": now})
    return changes


def report_key(report_path: Path) -> str:
    """The report's path inside its workflow folder ("results/report.json"), however it was named."""
    resolved = report_path.resolve()
    return resolved.relative_to(resolved.parent.parent).as_posix()


def read_signoffs(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def signoff_backend(record: dict[str, Any], signoffs_path: Path) -> str | None:
    """The backend of the run a sign-off was given to: recorded with it, or, for a sign-off from before it was,
    read from the signed report's copy beside the sign-offs (None when that is gone)."""
    if "backend" in record:
        return record["backend"]
    try:
        return json.loads((signoffs_path.parent / f"{record['report_sha256']}.json").read_text()).get("backend")
    except (OSError, ValueError):
        return None


def default_signoffs(report_path: Path) -> Path:
    """signoffs/signoffs.jsonl of the workflow folder the report belongs to (results/report.json's)."""
    return report_path.resolve().parent.parent / SIGNOFFS


def _html_digest(report_path: Path) -> str:
    return current_sha256(report_path.with_suffix(".html"))


def report_digests(report_path: Path) -> tuple[str, str]:
    """(sha256 of report.json, of report.html beside it, or "missing")."""
    return current_sha256(report_path), _html_digest(report_path)


def record_written_report(report_path: Path, digests: tuple[str, str] | None = None,
                          signoffs_path: Path | None = None) -> None:
    """Called by whatever writes the report, right after writing it: its digests (given by a writer that
    already hashed both files, else read here) join the ledger of reports the workflow wrote (append-only,
    kept by `make clean` with the sign-offs)."""
    ledger = (signoffs_path or default_signoffs(report_path)).parent / REPORTS_WRITTEN
    ledger.parent.mkdir(parents=True, exist_ok=True)
    json_sha256, html_sha256 = digests or report_digests(report_path)
    line = {"report": report_key(report_path), "report_sha256": json_sha256, "report_html_sha256": html_sha256,
            "written": now_iso()}
    with open(ledger, "a") as handle:
        handle.write(json.dumps(line, sort_keys=True) + "\n")


def written_by_workflow(report_path: Path, digests: tuple[str, str], signoffs_path: Path) -> bool:
    """Whether the report with these digests (report_digests: both files as they are now) is one the
    workflow wrote."""
    ledger = signoffs_path.parent / REPORTS_WRITTEN
    now = (report_key(report_path), *digests)
    return any((line["report"], line["report_sha256"], line["report_html_sha256"]) == now
               for line in read_signoffs(ledger))


def signoff_state(record: dict[str, Any], digests: tuple[str, str], written: bool) -> str | None:
    """For the report on disk (its digests, and whether the workflow wrote it): None while it is the signed
    one; "superseded" when the workflow has written another report since (a newer run); "edited" when the
    files on disk are no report the workflow wrote."""
    if digests == (record["report_sha256"], record["report_html_sha256"]):
        return None
    return "superseded" if written else "edited"


def signoff(
    report_path: Path, name: str, decision: str, note: str, signoffs_path: Path | None = None
) -> dict[str, Any]:
    """Appends one sign-off bound to the digests of report.json and report.html (and what the report said),
    keeps a copy of both beside the sign-offs, and returns the record. An approval needs a report of a run
    that did not fail, whose artifacts are all as recorded."""
    signoffs_path = signoffs_path or default_signoffs(report_path)
    if not name.strip():
        raise SignoffError("NAME is empty: a sign-off names the reviewer")
    if decision not in DECISIONS:
        raise SignoffError(f"DECISION = {decision!r}: allowed: {', '.join(DECISIONS)}")
    if not report_path.is_file():
        raise SignoffError(f"{report_path}: no report to sign off (run the pilot first)")
    report = json.loads(report_path.read_text())
    json_sha256, html_sha256 = digests = report_digests(report_path)
    if decision == "approve":
        if not written_by_workflow(report_path, digests, signoffs_path):
            raise SignoffError(f"{report_path}: not a report the workflow wrote (its sha256 and its html's are "
                               f"not in {signoffs_path.parent / REPORTS_WRITTEN}): only DECISION=reject")
        if report.get("failed_run") or report["status"] != "pass":
            why = "a failed run" if report.get("failed_run") or report["status"] == "fail" else "stages did not run"
            raise SignoffError(f"{report_path}: status {report['status']} ({why}): only DECISION=reject")
        changed = artifact_changes(report, report_path.resolve().parent.parent)
        if changed:
            raise SignoffError(f"{report_path}: {len(changed)} artifact(s) changed since their stage recorded "
                               "them (make verify lists them): only DECISION=reject")
    record = {
        "name": name.strip(),
        "date": now_iso(),
        "decision": decision,
        "note": note,
        "report": report_key(report_path),
        "report_sha256": json_sha256,
        "report_html_sha256": html_sha256,
        "report_status": report["status"],
        "backend": report["backend"],
        "report_started": report["provenance"].get("started"),
        "config_digest": report["provenance"].get("config_digest"),
        "commit": report["provenance"].get("commit"),
        "dirty": report["provenance"].get("dirty"),
    }
    # A copy of what was signed: a later run (or a failed one) rewrites results/report.*, and a comparison
    # with the last signed-off run needs the signed report itself.
    signoffs_path.parent.mkdir(parents=True, exist_ok=True)
    for suffix in (".json", ".html"):
        source = report_path.with_suffix(suffix)
        if source.is_file():
            shutil.copy2(source, signoffs_path.parent / f"{record['report_sha256']}{suffix}")
    with open(signoffs_path, "a") as handle:  # append-only: earlier sign-offs are never rewritten
        handle.write(json.dumps(record, sort_keys=True) + "\n")
    return record


def verify(report_path: Path, signoffs_path: Path | None = None) -> tuple[list[str], bool]:
    """What changed since the report recorded it, in lines to print, and whether everything still holds:
    a changed artifact or an edited signed report fails; a sign-off of a report that a newer run replaced
    is listed, not failed."""
    signoffs_path = signoffs_path or default_signoffs(report_path)
    if not report_path.is_file():
        return [f"{report_path}: no report to verify"], False
    report = json.loads(report_path.read_text())
    changes = artifact_changes(report, report_path.resolve().parent.parent)
    digests = report_digests(report_path)
    written = written_by_workflow(report_path, digests, signoffs_path)
    # The sign-offs given to runs of this report's backend: a CPU rehearsal's approval says nothing of a trn2 run.
    states = [(record, signoff_state(record, digests, written)) for record in read_signoffs(signoffs_path)
              if record["report"] == report_key(report_path)
              and signoff_backend(record, signoffs_path) == report["backend"]]
    listed = sum(len(stage.get("artifacts", [])) for stage in report["stages"])
    outside = [c for c in changes if c["now"] == OUTSIDE]
    changed = [c for c in changes if c["now"] != OUTSIDE]
    lines = [f"{report_path}: {listed} artifacts listed, {len(changed)} changed or missing"
             + (f", {len(outside)} outside the project (not read)" if outside else "")
             + f"; report status {report['status']}"]
    lines += [f"  CHANGED {c['path']} ({c['stage']}): recorded sha256 {c['recorded']}, now {c['now']}" for c in changed]
    root = report_path.resolve().parent.parent
    lines += [f"  OUTSIDE THE PROJECT {c['path']} ({c['stage']}) -> {c['target']}: resolves outside the project "
              f"{root}; not read" for c in outside]
    for record, state in states:
        what = f"{record['decision']} by {record['name']} on {record['date']}"
        if state == "edited":
            lines.append(f"  EDITED SINCE SIGN-OFF {what}: given to report.json sha256 {record['report_sha256']} "
                         f"(html {record['report_html_sha256']}), which is now {digests[0]} (html {digests[1]}), "
                         "a report the workflow never wrote")
        elif state == "superseded":
            lines.append(f"  superseded: {what} was given to an earlier run's report (kept as "
                         f"{signoffs_path.parent / record['report_sha256']}.json)")
        else:
            lines.append(f"  signed: {what}, this report")
    edited = any(state == "edited" for _, state in states)
    return lines, not changes and not edited


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="verify the report's artifacts, or sign the report off")
    parser.add_argument("--report", type=Path, default=DEFAULT_REPORT)
    parser.add_argument("--signoffs", type=Path, default=None, help="default: signoffs/ of the report's workflow")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("verify")
    sign = commands.add_parser("signoff")
    sign.add_argument("--name", required=True)
    sign.add_argument("--decision", required=True)
    sign.add_argument("--note", default="")
    args = parser.parse_args(argv)
    # Never read or sign a report while a run in its folder may be rewriting it.
    from .unlock import refuse_while_running

    busy = refuse_while_running(args.report.resolve().parent.parent, args.command)
    if busy:
        print(busy, file=sys.stderr)
        return 3
    if args.command == "verify":
        lines, ok = verify(args.report, args.signoffs)
        print("\n".join(lines))
        return 0 if ok else 1
    try:
        record = signoff(args.report, args.name, args.decision, args.note, args.signoffs)
    except SignoffError as error:
        print(f"signoff: {error}", file=sys.stderr)
        return 2
    print(f"signed off: {record['decision']} by {record['name']} on {record['date']}, report.json sha256 "
          f"{record['report_sha256']} (report status {record['report_status']}) -> "
          f"{args.signoffs or default_signoffs(args.report)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
