"""After a Snakemake that was killed outright (SIGKILL, a closed terminal, the OOM killer): its lock stays in
.snakemake/locks, and the next command stops on it. `make unlock` (python -m qwen3_pilot.unlock) clears it only
when no process of this workflow is alive (a Snakemake, a stage script, torchrun or a rank working in this folder),
and otherwise refuses, naming each one. The stages end with the Snakemake that started them (lifetime), so after a
kill there is nothing left to wait for, but a second Snakemake may legitimately be running.

Standard library only: the Snakefile calls `stale_lock_note` while it parses.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# What a process of this workflow has on its command line (with this folder as its working folder).
WORKFLOW_COMMANDS = ("snakemake", ".snakemake/scripts/", "torch.distributed.run", "qwen3_pilot.titan.in_ranks")


def workflow_processes(root: Path, proc: Path = Path("/proc")) -> list[tuple[int, str]]:
    """(pid, command line) of each live process working in `root` whose command line is this workflow's, this
    process left out."""
    root = Path(root).resolve()
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = Path(os.readlink(entry / "cwd"))
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone, or not ours to read
            continue
        if cwd == root and any(marker in command for marker in WORKFLOW_COMMANDS):
            found.append((int(entry.name), command))
    return sorted(found)


def ancestors(proc: Path = Path("/proc")) -> set[int]:
    """This process's parent, its parent, and so on up to init."""
    found, pid = set(), os.getpid()
    while pid > 1:
        try:
            stat = (proc / str(pid) / "stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state; the name may hold spaces
        found.add(pid)
    return found


def other_runs(root: Path) -> list[tuple[int, str]]:
    """The workflow's processes in `root` other than the ones this process runs under: a run in progress that
    a command reading its results (verify, sign-off, the archive) must not race."""
    mine = ancestors()
    return [(pid, command) for pid, command in workflow_processes(root) if pid not in mine]


def listed(processes: list[tuple[int, str]]) -> str:
    """One line per process for a message: its pid and the start of its command line."""
    return "\n".join(f"  {pid}: {command[:200]}" for pid, command in processes)


def refuse_while_running(root: Path, what: str) -> str | None:
    """Why `what` cannot run now in `root` (a run is rewriting its results), naming each process; None when
    nothing else of the workflow runs there."""
    running = other_runs(root)
    if not running:
        return None
    why = f"{what}: a run of this workflow is in progress in {root}; run it again when that has ended:"
    return f"{why}\n{listed(running)}"


def locks(root: Path) -> list[Path]:
    folder = Path(root) / ".snakemake" / "locks"
    return sorted(folder.iterdir()) if folder.is_dir() else []


def stale_lock_note(root: Path) -> str | None:
    """A line for the user when `root` holds a Snakemake lock and no process of this workflow is alive to hold
    it; None otherwise."""
    if locks(root) and not workflow_processes(root):
        return (f"{root}/.snakemake/locks holds the lock of a Snakemake that is no longer running (killed?): "
                "run `make unlock`, which checks that nothing of this workflow is alive, then unlocks")
    return None


def main(argv: list[str] | None = None) -> int:
    root = Path.cwd()
    alive = workflow_processes(root)
    if alive:
        print(f"make unlock: {len(alive)} process(es) of this workflow are alive in {root}; not unlocking:\n"
              + listed(alive), file=sys.stderr)
        return 1
    if not locks(root):
        print(f"make unlock: {root} holds no Snakemake lock")
        return 0
    return subprocess.run([sys.executable, "-m", "snakemake", "--unlock", *(argv or sys.argv[1:])]).returncode


if __name__ == "__main__":
    sys.exit(main())
