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
from pathlib import Path
from typing import Iterable, Iterator

from .artifacts import check_custody
from .backends import keep_compiler_caches_in_project
from .config import CACHE_ROOT
from .summary import mark_stage_started, write_failure

log = logging.getLogger("qwen3_pilot")


@contextlib.contextmanager
def stage_log(path: str | Path, consumes: Iterable[str | Path] = ()) -> Iterator[logging.Logger]:
    """The job's log for everything the stage does; `consumes` (the job's inputs) is checked against what
    the producing stages recorded before the stage does anything (artifacts.check_custody)."""
    mark_stage_started()  # the summary's "started": when the stage's work begins, not when it is written
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


def keep_failed_log(path: Path) -> Path:
    """A copy of a failed job's log that outlives the rerun: Snakemake empties a job's declared log when
    the job starts again."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    kept = path.with_name(f"{path.stem}.failed-{stamp}{path.suffix}")
    shutil.copy2(path, kept)
    return kept
