"""The one torchrun launcher: a failing rank is named from the error file torchelastic's @record writes
(against the installed torchrun), a killed launch names the signal, the ranks go with the launcher."""

from __future__ import annotations

import json
import os
import sys

import pytest
from conftest import PROJECT, backend_config

from qwen3_pilot.backends import make_backend
from qwen3_pilot.launch import PID_FILE, Launch, failure_cause, run_torchrun

pytestmark = pytest.mark.torchrun

FAILING_RANK = '''
import os
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    if os.environ["RANK"] == "1":
        raise ValueError("rank 1 found a tensor of shape [3, 4]\\nexpected [4, 4]")

main()
'''


def backend(tmp_path):
    return make_backend(backend_config("cpu", 2), str(tmp_path / "cache"))


def launch(tmp_path, module_source):
    (tmp_path / "rank_module.py").write_text(module_source)
    cpu = backend(tmp_path)
    log_path = tmp_path / "logs" / "stage.log"
    log_path.parent.mkdir(exist_ok=True)
    rank_logs = cpu.rank_log_dir(log_path, "run")
    command = cpu.torchrun_command(sys.executable, 2, "rank_module", [], rank_log_dir=rank_logs)
    env = {**cpu.launcher_env, "PYTHONPATH": f"{tmp_path}{os.pathsep}{PROJECT / 'workflow' / 'scripts'}"}
    return run_torchrun(command, env, log_path=log_path, pid_dir=tmp_path / "run", rank_log_dir=rank_logs)


def test_the_failing_rank_and_its_whole_message_come_from_its_error_file(tmp_path):
    result = launch(tmp_path, FAILING_RANK)
    assert result.returncode == 1
    cause = failure_cause(result)
    assert cause.startswith("torchrun exited with code 1: local rank 1: ValueError: rank 1 found a tensor of "
                            "shape [3, 4]\nexpected [4, 4] (error file: "), cause
    assert not (tmp_path / "run" / PID_FILE).exists()
    assert result.output().startswith("$ ") and "rank 1 found a tensor" in result.output()


def test_an_earlier_launchs_error_file_is_not_this_launchs(tmp_path):
    launch(tmp_path, FAILING_RANK)
    result = launch(tmp_path, "print('fine')\n")
    assert result.returncode == 0 and result.rank_error() is None


def test_a_launch_killed_by_a_signal_names_it(tmp_path):
    killed = Launch([], {}, -9, 1.0, log_path=tmp_path / "log", rank_log_dir=tmp_path / "none")
    assert failure_cause(killed).startswith("torchrun was killed by signal 9: no rank recorded an error")
    error_dir = tmp_path / "ranks" / "run_abc" / "attempt_0"
    for rank, stamp in ((0, "20"), (1, "10")):
        (error_dir / str(rank)).mkdir(parents=True)
        (error_dir / str(rank) / "error.json").write_text(json.dumps(
            {"message": {"message": f"RuntimeError: rank {rank}", "extraInfo": {"timestamp": stamp}}}))
    first = Launch([], {}, 1, 1.0, rank_log_dir=tmp_path / "ranks")
    assert first.rank_error().startswith("local rank 1: RuntimeError: rank 1")  # the earliest, not rank 0


def test_a_launch_runs_in_the_given_folder_with_the_given_environment_not_the_processs(tmp_path, monkeypatch):
    """cwd= and base_env= (what a relaunch on a background thread passes): the process's own folder and environment,
    which another thread may change meanwhile, reach the launch only when neither is given."""
    monkeypatch.setenv("SET_BY_ANOTHER_THREAD", "1")
    folder = tmp_path / "workflow"
    folder.mkdir()
    command = [sys.executable, "-c", "import os; print(os.getcwd(), os.environ.get('SET_BY_ANOTHER_THREAD'), "
               "os.environ['GIVEN'], os.environ['ADDED'])"]
    result = run_torchrun(command, {"ADDED": "a"}, log_path=tmp_path / "launch.log", pid_dir=tmp_path / "run",
                          rank_log_dir=None, cwd=folder, base_env={"GIVEN": "g"})
    assert result.returncode == 0, result.output()
    assert result.output().splitlines()[-1] == f"{folder} None g a"
