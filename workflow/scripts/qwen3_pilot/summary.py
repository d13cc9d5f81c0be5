"""The one JSON shape every stage writes, and that the report is built from."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .artifacts import describe_artifact, now_iso, remove_recorded, write_recorded_json
from .paths import HERE
from .stage_progress import running_code, stage_started

STATUSES = ("pass", "fail", "not_run")


def failure_path(stage: str) -> Path:
    """The stage's failure record in the job's workflow folder; its next successful summary removes it."""
    return HERE.failure_record(stage)


def write_failure(stage: str, error: BaseException, log_path: Path, kept_log: Path,
                  measured: dict[str, Any]) -> dict[str, Any]:
    """The failed stage's summary: status fail, the reason, and what it `measured` before it failed."""
    interrupted = isinstance(error, KeyboardInterrupt)
    summary = StageSummary(
        stage=stage,
        status="fail",
        backend="",
        figures={"reason": f"{type(error).__name__}: {error}", **measured},
        notes=[("INTERRUPTED: " if interrupted else "FAILED: ") + f"{type(error).__name__}: {error}",
               f"log: {log_path} (kept as {kept_log})"],
        proves="Nothing: the stage failed; its figures are what it measured before the failure.",
        does_not_prove="Anything the stage would have checked after the failure.",
    )
    return summary.write(failure_path(stage))


@dataclass(kw_only=True)
class StageRecord:
    """What every stage record holds: the figures, the artifacts with their sha256, and when the work ran."""

    stage: str
    backend: str
    figures: dict[str, Any] = field(default_factory=dict)
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    started: str = field(default_factory=stage_started)
    ended: str = ""
    # What ran: the job's code digest, commit and uncommitted changes (StageRun; {} outside one).
    code: dict[str, Any] = field(default_factory=running_code)

    def add_artifacts(self, paths: list[Path], root: Path | None = None) -> None:
        self.artifacts.extend(describe_artifact(Path(p), root) for p in paths)

    def write(self, path: Path) -> dict[str, Any]:
        self.ended = self.ended or now_iso()
        payload = asdict(self)
        write_recorded_json(path, payload)
        return payload


@dataclass(kw_only=True)
class StageMeasurement(StageRecord):
    """What a measuring stage ran and measured, with no verdict: measured.json, which rule judge holds to
    the configured thresholds, so that a threshold edit re-judges these figures without measuring again."""


@dataclass(kw_only=True)
class StageSummary(StageRecord):
    """A stage's verdict with its record: what the report is built from (summary.json)."""

    status: str
    proves: str = ""
    does_not_prove: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"stage {self.stage}: status {self.status!r} is not one of {STATUSES}")

    def write(self, path: Path) -> dict[str, Any]:
        payload = super().write(path)
        if self.status != "fail":
            remove_recorded(failure_path(self.stage))  # this run replaces an earlier failure
        return payload
