"""What the stage in progress has done so far: when its work began and what it has measured. The active
StageRun owns it (stage_run.py); the stage's modules add to it with record_measured, deep in their calls, and
the summary reads its start. Measure, then judge: a stage records what it measured before it checks it, so
that a failed check still leaves its figures, in the failure record the StageRun writes, for the report.

A context variable, set for the StageRun's block and reset after it: outside a StageRun (a unit test calling
a stage's function, a tool) nothing is in progress, a figure recorded has no failure record to go to, and a
summary's start is when it is made."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from .artifacts import now_iso


@dataclass
class StageProgress:
    started: str = field(default_factory=now_iso)
    measured: dict[str, Any] = field(default_factory=dict)
    # The code the job runs: its rule's digest (parse_time/code.py), the commit and whether tracked files differ.
    code: dict[str, Any] = field(default_factory=dict)


_IN_PROGRESS: ContextVar[StageProgress | None] = ContextVar("stage_in_progress", default=None)


@contextlib.contextmanager
def begin_progress(code: dict[str, Any] | None = None) -> Iterator[StageProgress]:
    """A stage's work from now on (StageRun's block), running `code`."""
    progress = StageProgress(code=dict(code or {}))
    token = _IN_PROGRESS.set(progress)
    try:
        yield progress
    finally:
        _IN_PROGRESS.reset(token)


def record_measured(**figures: Any) -> None:
    """Figures the stage measured, kept for its failure record should a later check fail."""
    progress = _IN_PROGRESS.get()
    if progress is not None:
        progress.measured.update(figures)


def running_code() -> dict[str, Any]:
    """The code the stage in progress runs (nothing outside a StageRun)."""
    progress = _IN_PROGRESS.get()
    return dict(progress.code) if progress is not None else {}


def stage_started() -> str:
    """When the stage in progress began its work (now, outside a StageRun)."""
    progress = _IN_PROGRESS.get()
    return progress.started if progress is not None else now_iso()
