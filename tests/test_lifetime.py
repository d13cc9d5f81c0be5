"""A process that asked to die with its parent does, even in a session of its own (as torchrun starts ranks)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

LAUNCHER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", {child!r}], start_new_session=True)
print(child.pid, flush=True)
time.sleep(60)
"""
RANK = "from qwen3_pilot.lifetime import die_with_parent; import time; assert die_with_parent(); time.sleep(60)"
PLAIN_RANK = "import time; time.sleep(60)"


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def rank_after_launcher_killed(child_code: str) -> bool:
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER.format(child=child_code)], stdout=subprocess.PIPE,
                                text=True)
    rank = int(launcher.stdout.readline())
    time.sleep(1.0)  # the rank has made its request
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    deadline = time.monotonic() + 5
    while alive(rank) and time.monotonic() < deadline:
        time.sleep(0.1)
    still_alive = alive(rank)
    if still_alive:
        os.kill(rank, signal.SIGKILL)
    return still_alive


def test_a_rank_dies_with_its_launcher():
    assert not rank_after_launcher_killed(RANK)


def test_without_it_a_rank_outlives_its_launcher():
    assert rank_after_launcher_killed(PLAIN_RANK)
