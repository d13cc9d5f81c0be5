"""Stage pin_env: each pinned package against the installed version (rule pin_package, one stamp per package),
then the whole environment for the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..pins import Pin, PinError, check_pin, environment_facts, format_table, installed_version


def run_package(package: str, pinned: str, out: Path) -> dict[str, Any]:
    """Checks one pin against the version installed now and writes its stamp; a mismatch writes nothing."""
    row = check_pin(Pin(package, pinned), installed_version(package))
    from ..artifacts import write_json

    write_json(out, row)
    return row


def run(
    stamps: list[Path], backend: dict[str, Any], pins_file: str, cache_root: str, out: Path
) -> dict[str, Any]:
    from ..backends import make_backend
    from ..summary import StageSummary, record_measured

    rows = [json.loads(Path(p).read_text()) for p in stamps]
    record_measured(packages=rows)
    bad = [r for r in rows if not r["ok"]]
    if bad:
        raise PinError("pinned versions not installed:\n" + format_table(bad))
    summary = StageSummary(
        stage="pin_env",
        status="pass",
        backend=backend["backend"],
        figures={
            "pins_file": pins_file,
            "packages": rows,
            "environment": environment_facts(),
            "system": make_backend(backend, cache_root).system_versions(),
        },
        proves=f"Every package pinned in {pins_file} is installed at its pinned version in the environment "
        "that ran the stages.",
        does_not_prove="That the pinned versions are the right ones, or that packages not named in the pins "
        "file are the same as on another machine.",
    )
    summary.add_artifacts([Path(p) for p in stamps])
    return summary.write(out)
