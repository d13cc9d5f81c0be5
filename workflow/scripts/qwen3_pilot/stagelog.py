"""Per-job logging for the stage scripts: everything goes to the rule's log file, and a failure's
message also reaches the console so the user sees why the job failed without opening the log. A failed
job's log is also kept beside it under a timestamped name."""

from __future__ import annotations

import contextlib
import datetime
import logging
import shutil
import sys
import traceback
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NoReturn

from .artifacts import check_custody
from .backends import keep_compiler_caches_in_project
from .config import CACHE_ROOT
from .lifetime import die_with_parent, exit_once_recorded
from .summary import mark_stage_started, write_failure

log = logging.getLogger("qwen3_pilot")


@contextlib.contextmanager
def stage_log(
    path: str | Path, consumes: Iterable[str | Path] = (), *, end_process: bool = False
) -> Iterator[logging.Logger]:
    """The job's log for everything the stage does; `consumes` (the job's inputs) is checked against what
    the producing stages recorded before the stage does anything (artifacts.check_custody). With
    `end_process` (a stage script's own process), a stage that succeeded ends its process at once
    (`end_stage_process`)."""
    mark_stage_started()  # the summary's "started": when the stage's work begins, not when it is written
    if end_process:
        # A stage script's own process ends with the Snakemake that started it, however that ends (a SIGKILL
        # included); torchrun ends with the stage and each rank with torchrun (lifetime).
        die_with_parent()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    keep_compiler_caches_in_project(str(Path(CACHE_ROOT).resolve()))
    console = sys.stderr
    with open(path, "a", buffering=1) as handle, contextlib.redirect_stdout(handle), contextlib.redirect_stderr(handle):
        logging.basicConfig(
            stream=handle, level=logging.INFO, force=True, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        try:
            check_custody(consumes)
            yield log
        except BaseException as error:
            traceback.print_exc(file=handle)
            handle.flush()
            kept = keep_failed_log(path)
            # logs/<stage>/<job>.log: the stage is the log's folder (pin_package's jobs are pin_env's).
            write_failure(path.parent.name, error, path, kept)
            console.write(f"{type(error).__name__}: {error}\n(full log: {path}; kept as {kept})\n")
            raise
    if end_process:
        end_stage_process()


def end_stage_process() -> NoReturn:
    """Exits as soon as the stage's work is recorded. The interpreter's teardown after torch is no work of
    the stage, yet Snakemake waits for it: measured on the 2-core build machine, 0.8 s after importing torch
    and 1.3-2.5 s after a torch.compile, i.e. more than a small stage's whole work (lifetime.exit_once_recorded)."""
    exit_once_recorded()


def keep_failed_log(path: Path) -> Path:
    """A copy of a failed job's log that outlives the rerun: Snakemake empties a job's declared log when
    the job starts again."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    kept = path.with_name(f"{path.stem}.failed-{stamp}{path.suffix}")
    shutil.copy2(path, kept)
    return kept
