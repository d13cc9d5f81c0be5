"""The stages' one torchrun launcher (runs in the stage process): torchrun in its own process group, dead
with the stage however the stage ends, every rank stopped when torchrun returns, its output appended to the
stage log; and why a launch failed, from the error file torchelastic's @record wrote for the failing rank
(the rank entry points in qwen3_pilot.titan.in_ranks are decorated with it), not from scraping tracebacks.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .lifetime import die_with_parent

PID_FILE = "launcher.pid"


@dataclass
class Launch:
    command: list[str]
    env: dict[str, str]
    returncode: int
    wall_s: float
    # Wall clock (epoch seconds) when torchrun was started.
    started_at: float = 0.0
    # This launch's part of the stage log: [log_start, log_end) in bytes.
    log_path: Path | None = None
    log_start: int = 0
    log_end: int = 0
    # torchrun's --log-dir for this launch: a failing rank's error file, and on a backend that keeps only some
    # ranks on the console, every rank's stdout and stderr.
    rank_log_dir: Path | None = None

    def output(self) -> str:
        if self.log_path is None:
            return ""
        with open(self.log_path, "rb") as log:
            log.seek(self.log_start)
            return log.read(self.log_end - self.log_start).decode(errors="replace")

    def rank_error(self) -> str | None:
        """The first failure a rank recorded (torchelastic error file: earliest, then lowest local rank), as
        "local rank N: <exception>"; None when no rank recorded one (killed, or dead before Python ran)."""
        if self.rank_log_dir is None:
            return None
        errors = []
        # torchrun writes <log-dir>/<run id>_<random>/attempt_<n>/<local rank>/error.json; the folder is
        # emptied before each launch, so every file here is this launch's.
        for path in Path(self.rank_log_dir).glob("*/attempt_*/*/error.json"):
            data = json.loads(path.read_text())["message"]
            message = data["message"] if isinstance(data, dict) else str(data)
            timestamp = int(data.get("extraInfo", {}).get("timestamp", 0)) if isinstance(data, dict) else 0
            errors.append((timestamp, int(path.parent.name), message, path))
        if not errors:
            return None
        _, local_rank, message, path = min(errors)
        return f"local rank {local_rank}: {message} (error file: {path})"


def kill_group(pgid: int) -> None:
    if pgid <= 0:
        return
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def stop_orphans(pid_dir: Path) -> None:
    """Stops the ranks of an earlier launch whose launcher was killed before it could (its pid file)."""
    pid_file = Path(pid_dir) / PID_FILE
    if pid_file.exists():
        kill_group(int(pid_file.read_text().strip() or 0))
        pid_file.unlink()


def run_torchrun(command: list[str], added_env: dict[str, str], *, log_path: Path, pid_dir: Path,
                 rank_log_dir: Path | None, cwd: Path | None = None,
                 base_env: Mapping[str, str] | None = None) -> Launch:
    """Runs one torchrun command (from Backend.torchrun_command) in `cwd` (default: this process's folder) with
    `added_env` over `base_env` (default: this process's environment). A caller on a thread of a process that
    others may change (a test suite's background launches) passes both rather than rely on the process's."""
    if rank_log_dir is not None and Path(rank_log_dir).exists():
        shutil.rmtree(rank_log_dir)  # an earlier launch's error files are not this launch's
    if "TMPDIR" in added_env:
        Path(added_env["TMPDIR"]).mkdir(parents=True, exist_ok=True)
    pid_dir.mkdir(parents=True, exist_ok=True)
    log_start = log_path.stat().st_size if log_path.exists() else 0
    with open(log_path, "a") as log:
        log.write(f"$ {' '.join(command)}\n")
        log.flush()
        started, started_at = time.perf_counter(), time.time()
        # Its own session, so that every process of the launch can be stopped as a group; and dead with this
        # stage process however it ends (lifetime.py: the ranks die with torchrun in turn).
        process = subprocess.Popen(
            command, env={**(os.environ if base_env is None else base_env), **added_env}, cwd=cwd, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent,
        )
        (pid_dir / PID_FILE).write_text(str(process.pid))
        try:
            returncode = process.wait()
        finally:
            kill_group(process.pid)  # ranks left behind by a launcher that died
        wall_s = time.perf_counter() - started
    (pid_dir / PID_FILE).unlink(missing_ok=True)
    return Launch(command=command, env=added_env, returncode=returncode, wall_s=wall_s, started_at=started_at,
                  log_path=log_path, log_start=log_start, log_end=log_path.stat().st_size, rank_log_dir=rank_log_dir)


def how_it_ended(launch: Launch) -> str:
    """ "torchrun exited with code N" or "torchrun was killed by signal N"."""
    if launch.returncode < 0:
        return f"torchrun was killed by signal {-launch.returncode}"
    return f"torchrun exited with code {launch.returncode}"


def failure_cause(launch: Launch) -> str:
    """How the launch ended and the first rank error, e.g. "torchrun exited with code 1: local rank 1:
    ValueError: ..."."""
    error = launch.rank_error() or (f"no rank recorded an error (killed, or it died before Python started; "
                                    f"see {launch.log_path})")
    return f"{how_it_ended(launch)}: {error}"
