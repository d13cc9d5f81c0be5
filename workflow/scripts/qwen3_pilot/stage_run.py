"""The harness every stage script runs its stage in, one visible construct:

    with StageRun.of_job(snakemake) as stage:
        run(..., cache_root=stage.cache_root, log_path=stage.log_path)

It owns what every stage does around its work: when the work began (the summary's "started"), the job's log
(everything the stage prints goes there; a failure's message also reaches the console, and the failed log is
kept past Snakemake's rerun), the compile caches under the project, the chain of custody of the job's inputs,
the failure record with whatever the stage measured before it failed, and the end of the stage's process.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import shutil
import sys
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .artifacts import check_custody
from .backends import keep_compiler_caches_in_project
from .lifetime import die_with_parent, exit_once_recorded
from .parse_time.code import git_provenance
from .paths import HERE
from .stage_progress import StageProgress, begin_progress
from .stages import stage_of_job
from .summary import write_failure


class StageRun:
    """One stage's work in the process that runs it. `consumes` (the job's inputs) is checked against what the
    producing stages recorded before the stage does anything (artifacts.check_custody). With `end_process` (a
    stage script's own process) the process ends with the Snakemake that started it, however that ends, and
    at once when the stage succeeded (lifetime)."""

    def __init__(self, stage: str, log_path: str | Path, consumes: Iterable[str | Path] = (), *,
                 end_process: bool = False, code_digest: str | None = None) -> None:
        self.stage = stage
        # The digest of the code the job runs (its rule's `code` param), recorded in what the stage writes with
        # the commit: which code made a record, whatever ran since.
        self.code_digest = code_digest
        self.log_path = Path(log_path)
        self.consumes = list(consumes)
        self.end_process = end_process
        # The project's library caches (torch.compile's, matplotlib's, the ranks' temp folder), from the
        # workflow folder a job runs in.
        self.cache_root = str(HERE.cache.resolve())
        self.log = logging.getLogger("qwen3_pilot")
        self.progress: StageProgress | None = None
        self._exit = contextlib.ExitStack()

    @classmethod
    def of_job(cls, snakemake: Any) -> StageRun:
        """The stage a Snakemake job runs (stages.stage_of_job: rule `train`'s jobs are the stage their
        wildcard names), in the job's log, its inputs checked, in the script's own process."""
        return cls(stage_of_job(snakemake.rule, dict(snakemake.wildcards)), snakemake.log[0], snakemake.input,
                   end_process=True, code_digest=getattr(snakemake.params, "code", None))

    def __enter__(self) -> StageRun:
        # The summary's "started": when the stage's work begins, not when the summary is written.
        code = {"digest": self.code_digest, **git_provenance(HERE.root)} if self.code_digest else {}
        self.progress = self._exit.enter_context(begin_progress(code))
        if self.end_process:
            # torchrun ends with the stage and each rank with torchrun (lifetime); the stage ends with Snakemake.
            die_with_parent()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        keep_compiler_caches_in_project(self.cache_root)
        self._console = sys.stderr
        self._handle = self._exit.enter_context(open(self.log_path, "a", buffering=1))
        self._exit.enter_context(contextlib.redirect_stdout(self._handle))
        self._exit.enter_context(contextlib.redirect_stderr(self._handle))
        logging.basicConfig(stream=self._handle, level=logging.INFO, force=True,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        try:
            check_custody(self.consumes)
        except BaseException as error:
            self._fail(error)
            self._exit.close()
            raise
        return self

    def __exit__(self, error_type, error, trace) -> bool:
        if error is not None:
            self._fail(error)
        self._exit.close()
        if error is None and self.end_process:
            end_stage_process()
        return False  # a failure propagates: Snakemake sees the job fail

    def _fail(self, error: BaseException) -> None:
        traceback.print_exception(error, file=self._handle)
        self._handle.flush()
        kept = keep_failed_log(self.log_path)
        write_failure(self.stage, error, self.log_path, kept, self.progress.measured)
        self._console.write(f"{type(error).__name__}: {error}\n(full log: {self.log_path}; kept as {kept})\n")


def end_stage_process() -> None:
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
