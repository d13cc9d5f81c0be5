"""Processes that die with their parent: torchrun with the stage that launched it, each rank with torchrun.

torchrun is started in a session of its own (so the stage can stop its whole process group), and torchrun
(torchelastic's SubprocessHandler) starts each rank in a session of its own too. So a signal to the
stage's process group (Ctrl-C under Snakemake) never reaches torchrun or the ranks, and when the stage or
torchrun is killed outright nothing stops what it started: a rank outlives its launcher, holding its cores
or its NeuronCores. Linux's PR_SET_PDEATHSIG has the kernel SIGKILL a process when its parent ends,
however it ends; it survives exec, so it is set in the launched child before torchrun starts, and by each
rank first thing.
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import os
import signal
import sys
from typing import NoReturn

PR_SET_PDEATHSIG = 1  # linux/prctl.h
# Looked up once, at import: as a Popen preexec_fn, die_with_parent runs between fork and exec, where
# loading a library in a process that may have other threads is not safe.
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def die_with_parent() -> bool:
    """Ask the kernel to SIGKILL this process when its parent ends; False where that is not available
    (not Linux). A parent that already ended before the request took effect (this process was handed to
    init or a subreaper) ends this process now."""
    parent = os.getppid()
    if _PRCTL is None or _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        return False
    if os.getppid() != parent or parent == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return True


def end_import_pause() -> None:
    """The cyclic garbage collector back on in a rank that paused it for its imports (train_entry): what the imports
    made is moved out of its reach first (gc.freeze: module objects live as long as the process), so that no later
    collection walks it again either."""
    gc.freeze()
    gc.enable()


def exit_once_recorded() -> NoReturn:
    """Exits 0 once a process's work is recorded, skipping the interpreter's module teardown: after torch that
    teardown is no work of the process, takes seconds, and can abort in C++ destructors. The exit handlers still
    run (logging's flush, the compile worker pools' shutdown) and the standard streams are flushed."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
