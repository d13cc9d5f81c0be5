"""Per-job logging for the stage scripts: everything goes to the rule's log file, and a failure's
message also reaches the console so the user sees why the job failed without opening the log."""

from __future__ import annotations

import contextlib
import logging
import sys
import traceback
from pathlib import Path
from typing import Iterator

log = logging.getLogger("qwen3_pilot")


@contextlib.contextmanager
def stage_log(path: str | Path) -> Iterator[logging.Logger]:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    console = sys.stderr
    with open(path, "a", buffering=1) as handle, contextlib.redirect_stdout(handle), contextlib.redirect_stderr(handle):
        logging.basicConfig(
            stream=handle, level=logging.INFO, force=True, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        try:
            yield log
        except BaseException as error:
            traceback.print_exc(file=handle)
            console.write(f"{type(error).__name__}: {error}\n(full log: {path})\n")
            raise
