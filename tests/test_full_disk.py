"""A full disk loses nothing: on a real 64 KiB tmpfs, an atomic write and a staged folder that hit ENOSPC fail
naming the path, leave no temp file or partial folder behind, and keep what was there before; with space freed
the same write succeeds. Needs root (the mount); CI runs as root."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess

import pytest

from qwen3_pilot.artifacts import staging_dir, write_text

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None,
                                reason="needs root and mount for a tmpfs")


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
