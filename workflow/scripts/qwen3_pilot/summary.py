"""The one JSON shape every stage writes, and that the report is built from."""

from __future__ import annotations

import datetime as _dt
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .artifacts import describe_artifact, write_json

STATUSES = ("pass", "fail", "not_run")


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


# When this process's stage began its work (stagelog.stage_log sets it on entry): a summary is created at
# the end of the work, so its own creation time would make "started" equal "ended".
_stage_started: str | None = None


def mark_stage_started() -> str:
    global _stage_started
    _stage_started = now_iso()
    return _stage_started


def stage_started() -> str:
    return _stage_started or now_iso()


@dataclass
class StageSummary:
    stage: str
    status: str
    backend: str
    figures: dict[str, Any] = field(default_factory=dict)
    proves: str = ""
    does_not_prove: str = ""
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    started: str = field(default_factory=stage_started)
    ended: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"stage {self.stage}: status {self.status!r} is not one of {STATUSES}")

    def add_artifacts(self, paths: list[Path], root: Path | None = None) -> None:
        self.artifacts.extend(describe_artifact(Path(p), root) for p in paths)

    def write(self, path: Path) -> dict[str, Any]:
        self.ended = self.ended or now_iso()
        payload = asdict(self)
        write_json(path, payload)
        return payload
