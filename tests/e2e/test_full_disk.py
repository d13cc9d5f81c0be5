"""A full disk loses nothing: on a real 64 KiB tmpfs, an atomic write and a staged folder that hit ENOSPC fail
naming the path, leave no temp file or partial folder behind, and keep what was there before; with space freed
the same write succeeds. Then in a finished run: export_reload's folder, and the archive's destination, on a
1 MiB tmpfs. Needs root (the mount); CI runs as root."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from contextlib import contextmanager

import pytest
from conftest import AHEAD_ENV, output, run_snakemake, set_archive, started_ahead

from qwen3_pilot.archive import MANIFEST
from qwen3_pilot.artifacts import staging_dir, write_text

NO_TMPFS = os.geteuid() != 0 or shutil.which("mount") is None
# The started_ahead bodies below skip themselves too: they start whatever the markers of their tests say.
pytestmark = pytest.mark.skipif(NO_TMPFS, reason="needs root and mount for a tmpfs")


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], check=True)
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


def test_an_atomic_write_that_fills_the_disk_keeps_the_old_file_and_leaves_no_temp_file(small_disk):
    report = small_disk / "results" / "report.json"
    write_text(report, "the finished report\n")
    with pytest.raises(OSError) as raised:
        write_text(report, "x" * 200_000)
    assert raised.value.errno == errno.ENOSPC and f"writing {report}: No space left on device" in str(raised.value)
    assert report.read_text() == "the finished report\n"
    assert sorted(p.name for p in report.parent.iterdir()) == ["report.json"]
    write_text(report, "a new report\n")  # space was freed by the failed write's cleanup
    assert report.read_text() == "a new report\n"


def test_a_staged_folder_that_fills_the_disk_is_removed_and_the_finished_one_kept(small_disk):
    export = small_disk / "results" / "export_reload" / "hf"
    with staging_dir(export) as staging:
        (staging / "model.safetensors").write_bytes(b"\0" * 1000)
    with pytest.raises(OSError) as raised, staging_dir(export) as staging:
        (staging / "model.safetensors").write_bytes(b"\0" * 200_000)
    assert raised.value.errno == errno.ENOSPC
    assert [p.name for p in export.parent.iterdir()] == ["hf"]  # no .partial folder left
    assert (export / "model.safetensors").stat().st_size == 1000


@contextmanager
def mounted_small_disk(folder, size: str):
    """A `size` tmpfs mounted on the empty folder `folder` for the block."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def used_bytes(folder) -> int:
    stats = os.statvfs(folder)
    return (stats.f_blocks - stats.f_bfree) * stats.f_frsize


@contextmanager
def results_on_a_small_disk(ws, free: int):
    """The run's results/ on a tmpfs holding a copy of them with `free` bytes to spare; yields the function that
    frees space (the tmpfs grown, as a user would delete something else). The results on disk are back after."""
    results, aside = ws / "results", ws / "results.on-disk"
    results.rename(aside)
    try:
        with mounted_small_disk(results, "4g"):
            shutil.copytree(aside, results, symlinks=True, dirs_exist_ok=True)
            subprocess.run(["mount", "-o", f"remount,size={(used_bytes(results) + free) // 1024}k", str(results)],
                           check=True)
            yield lambda: subprocess.run(["mount", "-o", "remount,size=4g", str(results)], check=True)
    finally:
        results.rmdir()
        aside.rename(results)


@pytest.mark.e2e
@started_ahead
def test_a_full_disk_in_export_reload_fails_it_naming_the_path_and_the_plain_command_finishes_once_space_is_freed(
        copy_of_run, _):
    """The run's results/ on a tmpfs with 1 MiB to spare, and export_reload forced (its old outputs removed first,
    as Snakemake does, before the space is measured): its first HF export (3 MB of safetensors) fills the disk.
    The stage fails naming the path and the error, leaves no summary and no export folder a later stage could
    take as finished, and the failed run's report says so; with space freed, the plain command finishes."""
    if NO_TMPFS:
        pytest.skip("needs root and mount for a tmpfs")
    stage = copy_of_run / "results" / "export_reload"
    shutil.rmtree(stage)
    with results_on_a_small_disk(copy_of_run, free=1 << 20) as free_space:
        failed = run_snakemake(copy_of_run, "--cores", "1", "--forcerun", "export_reload", "results/report.html",
                               env=AHEAD_ENV)
        assert failed.returncode != 0
        log = (copy_of_run / "logs" / "export_reload" / "export_reload.log").read_text()
        assert "No space left on device" in log and "results/export_reload/" in log, log[-3000:]
        # Nothing that reads as finished: no summary, no export folder, no partial work left.
        assert not stage.exists() or list(stage.iterdir()) == [], list(stage.iterdir())
        report = json.loads((copy_of_run / "results" / "report.json").read_text())
        export = {s["stage"]: s for s in report["stages"]}["export_reload"]
        assert report["failed_run"] and export["status"] == "fail"
        assert "No space left on device" in export["figures"]["reason"], export["figures"]
        free_space()
        passed = run_snakemake(copy_of_run, "--cores", "1", "results/report.html", env=AHEAD_ENV)
        assert passed.returncode == 0, output(passed)[-3000:]
        report = json.loads((copy_of_run / "results" / "report.json").read_text())
        assert report["status"] == "pass", {s["stage"]: s["status"] for s in report["stages"]}
        assert list((stage / "hf").glob("*.safetensors")) and (stage / "summary.json").is_file()


@pytest.mark.e2e
@started_ahead
def test_a_full_disk_at_the_archive_destination_fails_naming_the_path_and_no_manifest_vouches_for_it(
        copy_of_run, scratch):
    """The archive's destination on a 1 MiB tmpfs: the copy fills it and `snakemake archive` fails naming the file
    and the error; no manifest is written there (the manifest is what says an archive is complete). With room, the
    same command archives the run."""
    if NO_TMPFS:
        pytest.skip("needs root and mount for a tmpfs")
    destination = scratch / "archive"
    set_archive(copy_of_run, destination=str(destination))
    with mounted_small_disk(destination, "1m"):
        failed = run_snakemake(copy_of_run, "--cores", "1", "archive", env=AHEAD_ENV)
        assert failed.returncode != 0
        assert "No space left on device" in output(failed) and str(destination) in output(failed), \
            output(failed)[-3000:]
        assert list(destination.rglob(MANIFEST)) == []
        assert not (copy_of_run / "results" / "archive" / "summary.json").exists()
    passed = run_snakemake(copy_of_run, "--cores", "1", "archive", env=AHEAD_ENV)
    assert passed.returncode == 0, output(passed)[-3000:]
    assert len(list(destination.rglob(MANIFEST))) == 1
