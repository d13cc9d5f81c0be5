"""make unlock (qwen3_pilot.unlock): a killed Snakemake's lock is cleared only when no process of the workflow is
alive in its folder, each live one named otherwise; the Snakefile names the command when it finds such a lock."""

from __future__ import annotations

import os

import pytest
from conftest import output, run_snakemake

from qwen3_pilot import unlock


def fake_proc(tmp_path, processes):
    """A /proc with (pid, cwd, command line) per process."""
    proc = tmp_path / "proc"
    for pid, cwd, command in processes:
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cwd").symlink_to(cwd)
        (proc / str(pid) / "cmdline").write_bytes(b"\0".join(part.encode() for part in command.split()) + b"\0")
    (proc / "self").mkdir()
    return proc


def test_only_this_workflows_processes_in_its_folder_are_found(tmp_path):
    root, other = tmp_path / "ws", tmp_path / "elsewhere"
    root.mkdir()
    other.mkdir()
    proc = fake_proc(tmp_path, [
        (101, root, "/venv/bin/python3 /venv/bin/snakemake --cores all results/report.html"),
        (102, root, "/venv/bin/python3 -m torch.distributed.run --standalone "
                    "-m qwen3_pilot.titan.in_ranks.train_entry"),
        (103, root, "/venv/bin/python3 /ws/.snakemake/scripts/tmpab12.train.py"),
        (104, root, "vim README.md"),
        (105, other, "/venv/bin/python3 /venv/bin/snakemake --cores 1"),
    ])
    assert [pid for pid, _ in unlock.workflow_processes(root, proc)] == [101, 102, 103]


def test_a_lock_with_nothing_alive_is_named_stale_and_unlock_refuses_while_something_lives(tmp_path, monkeypatch,
                                                                                         capsys):
    monkeypatch.chdir(tmp_path)
    assert unlock.stale_lock_note(tmp_path) is None  # no lock
    (tmp_path / ".snakemake" / "locks").mkdir(parents=True)
    (tmp_path / ".snakemake" / "locks" / "0.input.lock").write_text("")
    monkeypatch.setattr(unlock, "workflow_processes", lambda root: [(4242, "python snakemake --cores all")])
    assert unlock.stale_lock_note(tmp_path) is None  # held by a live Snakemake
    assert unlock.main([]) == 1
    assert "4242: python snakemake --cores all" in capsys.readouterr().err
    monkeypatch.setattr(unlock, "workflow_processes", lambda root: [])
    assert "run `make unlock`" in unlock.stale_lock_note(tmp_path)


def test_the_snakefile_names_make_unlock_when_a_killed_run_left_its_lock(workspace):
    ws = workspace()
    (ws / ".snakemake" / "locks").mkdir(parents=True)
    (ws / ".snakemake" / "locks" / "0.input.lock").write_text(f"{ws}/results/report.html\n")
    result = run_snakemake(ws, "-n", "results/report.html")
    assert "holds the lock of a Snakemake that is no longer running (killed?): run `make unlock`" in output(result)
    assert os.path.exists(ws / ".snakemake" / "locks" / "0.input.lock")


def test_a_stage_process_asks_to_end_with_its_parent(tmp_path, monkeypatch):
    from qwen3_pilot import stage_run

    asked = []
    monkeypatch.setattr(stage_run, "die_with_parent", lambda: asked.append(True) or True)
    monkeypatch.setattr(stage_run, "end_stage_process", lambda: None)
    with stage_run.StageRun("x", tmp_path / "logs" / "x" / "x.log", end_process=True):
        pass
    assert asked == [True]
    with stage_run.StageRun("x", tmp_path / "logs" / "x" / "y.log"):  # in-process use (tests, tools): not asked
        pass
    assert asked == [True]


def test_a_run_in_progress_is_named_but_the_snakemake_a_command_runs_under_is_not(monkeypatch, tmp_path):
    parent = os.getppid()
    assert parent in unlock.ancestors()
    monkeypatch.setattr(unlock, "workflow_processes", lambda root: [
        (parent, "python snakemake --cores 1 archive"), (99999, "python snakemake --cores all results/report.html")])
    assert unlock.other_runs(tmp_path) == [(99999, "python snakemake --cores all results/report.html")]
    message = unlock.refuse_while_running(tmp_path, "verify")
    assert message.startswith(f"verify: a run of this workflow is in progress in {tmp_path}")
    assert "99999: python snakemake --cores all results/report.html" in message
    monkeypatch.setattr(unlock, "workflow_processes", lambda root: [(parent, "python snakemake archive")])
    assert unlock.refuse_while_running(tmp_path, "verify") is None


def test_verify_signoff_and_the_archive_refuse_while_a_run_rewrites_the_report(monkeypatch, tmp_path, capsys):
    from qwen3_pilot import audit
    from qwen3_pilot.archive import ArchiveError
    from qwen3_pilot.stages.archive import run_copy

    monkeypatch.setattr(unlock, "workflow_processes", lambda root: [(99999, "python snakemake --cores all")])
    report = tmp_path / "results" / "report.json"
    assert audit.main(["--report", str(report), "verify"]) == 3
    assert audit.main(["--report", str(report), "signoff", "--name", "A", "--decision", "approve"]) == 3
    assert capsys.readouterr().err.count("a run of this workflow is in progress") == 2
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ArchiveError, match="the archive: a run of this workflow is in progress"):
        run_copy(settings={}, report_json=report, record_path=tmp_path / "results" / "archive" / "copied.json")
    assert not (tmp_path / "results" / "archive").exists()  # nothing started
