"""A process that asked to die with its parent does, even in a session of its own (as torchrun starts ranks).

No sleeps and no races: the rank says when its request is made, and after its launcher is killed and reaped
the test asks it to answer over a pipe. The kernel sends the rank its SIGKILL while the launcher exits, before
the launcher can be reaped, so by then a rank that asked is dead (the pipe reads end of file) and one that did
not still answers."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys

# The launcher starts the rank in a session of its own; the rank inherits the launcher's stdin and stdout,
# the test's pipes. The launcher then waits for its signal.
LAUNCHER = """
import signal, subprocess, sys
subprocess.Popen([sys.executable, "-c", {child!r}], start_new_session=True)
signal.pause()
"""
ANSWER = """
import os, sys
print("ready", os.getpid(), flush=True)
for line in sys.stdin:
    print("alive:", line.strip(), flush=True)
"""
RANK = "from qwen3_pilot.lifetime import die_with_parent\nassert die_with_parent()\n" + ANSWER
PLAIN_RANK = ANSWER
# Only so that a test that went wrong cannot hang the suite: nothing is asserted about time.
NEVER_HANG_S = 120


class Lines:
    """Lines from a pipe, read unbuffered (so that select sees every byte not yet read); "" at end of file."""

    def __init__(self, fd: int):
        self.fd, self.pending = fd, b""

    def next(self) -> str:
        while b"\n" not in self.pending:
            ready, _, _ = select.select([self.fd], [], [], NEVER_HANG_S)
            assert ready, f"nothing from the rank in {NEVER_HANG_S} s"
            chunk = os.read(self.fd, 4096)
            if not chunk:
                return self.pending.decode()
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line.decode() + "\n"


def rank_answers_after_launcher_killed(child_code: str) -> bool:
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER.format(child=child_code)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE)
    lines = Lines(launcher.stdout.fileno())
    try:
        assert lines.next().startswith("ready ")  # printed after the rank's request, if it makes one
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()  # reaped: the kernel has sent a rank that asked its SIGKILL
        try:
            os.write(launcher.stdin.fileno(), b"ping\n")
        except BrokenPipeError:  # the rank has exited: nobody left to read it
            return False
        answer = lines.next()
        assert answer in ("", "alive: ping\n"), answer
        return answer == "alive: ping\n"
    finally:
        launcher.kill()
        launcher.wait()
        # End of file on its stdin ends a rank that is still alive (its launcher is gone: nobody else holds it).
        launcher.stdin.close()
        launcher.stdout.close()

def test_a_rank_dies_with_its_launcher():
    assert not rank_answers_after_launcher_killed(RANK)


def test_without_it_a_rank_outlives_its_launcher():
    assert rank_answers_after_launcher_killed(PLAIN_RANK)



def test_a_rank_imports_with_the_collector_paused_and_runs_with_it_on_and_the_imports_frozen():
    """train_entry run as a rank pauses the cyclic collector before its first import (here main then stops at the
    missing recipe, before it turns it back on); imported by other code it pauses nothing. end_import_pause turns
    it back on with what was imported frozen (out of every later collection's walk)."""
    probe = ("import gc, runpy\ntry:\n    runpy.run_module('qwen3_pilot.titan.in_ranks.train_entry', "
             "run_name='__main__')\nexcept RuntimeError:\n    pass\nas_rank = gc.isenabled()\n"
             "from qwen3_pilot.lifetime import end_import_pause\nend_import_pause()\n"
             "import qwen3_pilot.titan.in_ranks.train_entry\n"
             "print(as_rank, gc.isenabled(), gc.get_freeze_count() > 0)")
    from qwen3_pilot.trainer_run import RECIPE_ENV

    env = {key: value for key, value in os.environ.items() if key != RECIPE_ENV}
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, env=env)
    assert result.stdout.split() == ["False", "True", "True"], result.stderr[-3000:]
