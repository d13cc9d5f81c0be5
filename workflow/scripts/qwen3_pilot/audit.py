"""`make verify` and `make signoff`: every artifact the report lists re-checked against the files on disk,
and a reviewer's decision recorded with the sha256 of the report.json it was made on.

    python -m qwen3_pilot.audit verify [--report results/report.json]
    python -m qwen3_pilot.audit signoff --name NAME --decision approve|reject [--note TEXT]

Sign-offs live in signoffs/signoffs.jsonl, outside results/, so that `make clean` and reruns leave them;
the report never fills them in itself (a report that held its own sign-off would change the digest the
sign-off is bound to). `verify` flags a sign-off whose report.json has changed since it was given.
Torch-free.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .artifacts import sha256_file
from .summary import now_iso

DEFAULT_REPORT = Path("results") / "report.json"
SIGNOFFS = Path("signoffs") / "signoffs.jsonl"
DECISIONS = ("approve", "reject")
MISSING = "missing"


class SignoffError(ValueError):
    pass


def artifact_changes(report: dict[str, Any], root: Path) -> list[dict[str, str]]:
    """Every artifact in the report whose file is missing or whose sha256 is not the recorded one; relative
    paths are the workflow folder's (`root`)."""
    changes = []
    for stage in report["stages"]:
        for artifact in stage.get("artifacts", []):
            path = Path(artifact["path"])
            path = path if path.is_absolute() else root / path
            now = sha256_file(path) if path.is_file() else MISSING
            if now != artifact["sha256"]:
                changes.append({"stage": stage["stage"], "path": artifact["path"], "recorded": artifact["sha256"],
                                "now": now})
    return changes


def read_signoffs(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def report_key(report_path: Path) -> str:
    """The report's path inside its workflow folder ("results/report.json"), however it was named."""
    resolved = report_path.resolve()
    return resolved.relative_to(resolved.parent.parent).as_posix()


def stale_signoffs(signoffs: list[dict[str, Any]], report_path: Path) -> list[dict[str, Any]]:
    """Sign-offs given to this report whose report.json has changed since."""
    current = sha256_file(report_path) if report_path.is_file() else MISSING
    return [s for s in signoffs if s["report"] == report_key(report_path) and s["report_sha256"] != current]


def signoff(report_path: Path, name: str, decision: str, note: str, signoffs_path: Path = SIGNOFFS) -> dict[str, Any]:
    """Appends one sign-off bound to the report's digest (and what the report said) and returns it."""
    if not name.strip():
        raise SignoffError("NAME is empty: a sign-off names the reviewer")
    if decision not in DECISIONS:
        raise SignoffError(f"DECISION = {decision!r}: allowed: {', '.join(DECISIONS)}")
    if not report_path.is_file():
        raise SignoffError(f"{report_path}: no report to sign off (run the pilot first)")
    report = json.loads(report_path.read_text())
    record = {
        "name": name.strip(),
        "date": now_iso(),
        "decision": decision,
        "note": note,
        "report": report_key(report_path),
        "report_sha256": sha256_file(report_path),
        "report_status": report["status"],
        "commit": report["provenance"].get("commit"),
        "dirty": report["provenance"].get("dirty"),
    }
    signoffs_path.parent.mkdir(parents=True, exist_ok=True)
    with open(signoffs_path, "a") as handle:  # append-only: earlier sign-offs are never rewritten
        handle.write(json.dumps(record, sort_keys=True) + "\n")
    return record


def verify(report_path: Path, signoffs_path: Path = SIGNOFFS) -> tuple[list[str], bool]:
    """What changed since the report recorded it, in lines to print, and whether everything still holds."""
    if not report_path.is_file():
        return [f"{report_path}: no report to verify"], False
    report = json.loads(report_path.read_text())
    root = report_path.resolve().parent.parent
    changes = artifact_changes(report, root)
    stale = stale_signoffs(read_signoffs(signoffs_path), report_path)
    listed = sum(len(stage.get("artifacts", [])) for stage in report["stages"])
    lines = [f"{report_path}: {listed} artifacts listed, {len(changes)} changed or missing; report status "
             f"{report['status']}"]
    lines += [f"  CHANGED {c['path']} ({c['stage']}): recorded sha256 {c['recorded']}, now {c['now']}" for c in changes]
    lines += [f"  STALE SIGN-OFF {s['decision']} by {s['name']} on {s['date']}: given to report.json sha256 "
              f"{s['report_sha256']}, which is now {sha256_file(report_path)}" for s in stale]
    return lines, not changes and not stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="verify the report's artifacts, or sign the report off")
    parser.add_argument("--report", type=Path, default=DEFAULT_REPORT)
    parser.add_argument("--signoffs", type=Path, default=SIGNOFFS)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("verify")
    sign = commands.add_parser("signoff")
    sign.add_argument("--name", required=True)
    sign.add_argument("--decision", required=True)
    sign.add_argument("--note", default="")
    args = parser.parse_args(argv)
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
          f"{record['report_sha256']} (report status {record['report_status']}) -> {args.signoffs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
