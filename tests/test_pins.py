"""Pins: parsing workflow/envs/<backend>.txt, comparing with what is installed, and the per-package stamps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig

import pytest
from conftest import PROJECT, output, run_snakemake

from qwen3_pilot.pins import (
    NOT_INSTALLED,
    Pin,
    PinError,
    check_pin,
    installed_distributions,
    installed_version,
    lock_drift,
    read_lock,
    read_pins,
)


def test_every_backend_pins_file_parses_and_pins_the_core_packages():
    from qwen3_pilot.backends.neuron.stack import read_release
    from qwen3_pilot.backends.neuron.stack.installed import release_pins

    for backend in ("cpu", "neuron"):
        pins = read_pins(PROJECT / "workflow" / "envs" / f"{backend}.txt")
        if backend == "neuron":  # torch and torchtitan (the fork, from git) are the SDK release file's
            assert "torchtitan" not in pins and "torch" not in pins
            pins |= release_pins(read_release("2.33.0"))
        for package in ("torch", "torchtitan", "transformers", "safetensors", "huggingface-hub", "snakemake"):
            assert package in pins, (backend, package)


def test_an_unrecorded_release_version_admits_nothing():
    assert not Pin("nki", "unrecorded").admits("0.7.0")


def test_the_cpu_pins_are_what_this_environment_has():
    for pin in read_pins(PROJECT / "workflow" / "envs" / "cpu.txt").values():
        assert check_pin(pin, installed_version(pin.package))["ok"]


@pytest.mark.parametrize("line", ["torch>=2.14", "torch", "torch==2.14.1,<3"])
def test_loose_pins_are_refused_with_file_and_line(tmp_path, line):
    path = tmp_path / "pins.txt"
    path.write_text(f"# comment\n{line}\n")
    with pytest.raises(PinError, match=r"pins.txt:2: .* must pin one exact version"):
        read_pins(path)


def test_a_mismatch_names_package_pinned_and_installed():
    with pytest.raises(PinError) as raised:
        check_pin(Pin("torch", "==9.9.9"), "2.14.1")
    table = str(raised.value).splitlines()
    assert table[1].split() == ["package", "pinned", "installed"]
    assert table[2].split() == ["torch", "==9.9.9", "2.14.1"]
    assert not Pin("nothing-here", "==1.0").admits(NOT_INSTALLED)


def test_pin_mismatch_fails_the_stage_and_leaves_no_stamp(workspace):
    ws = workspace()
    pins = ws / "workflow" / "envs" / "cpu.txt"
    pins.write_text(pins.read_text().replace("transformers==5.16.0", "transformers==5.99.0"))
    result = run_snakemake(ws, "--cores", "1", "results/pin_env/summary.json")
    assert result.returncode != 0
    text = output(result)
    assert "pinned version not installed" in text
    assert any(line.split() == ["transformers", "==5.99.0", "5.16.0"] for line in text.splitlines()), text
    assert not (ws / "results/pin_env/packages/transformers.json").exists()
    assert not (ws / "results/pin_env/summary.json").exists()


def test_stamps_hold_only_their_own_package(workspace):
    ws = workspace()
    result = run_snakemake(ws, "--cores", "1", "results/pin_env/packages/torch.json")
    assert result.returncode == 0, output(result)
    stamp = json.loads((ws / "results/pin_env/packages/torch.json").read_text())
    assert stamp == {"package": "torch", "pinned": "==2.14.1", "installed": installed_version("torch"), "ok": True}


# ---- the hash lock (workflow/envs/cpu.lock, make lock) ----

LOCK = PROJECT / "workflow" / "envs" / "cpu.lock"


def test_the_lock_holds_every_pin_at_its_pinned_version_with_hashes():
    locked = read_lock(LOCK)
    for pin in read_pins(PROJECT / "workflow" / "envs" / "cpu.txt").values():
        assert pin.admits(locked[pin.package]), (pin.package, locked.get(pin.package))
    # and their dependencies: far more than the pins
    assert len(locked) > 3 * len(read_pins(PROJECT / "workflow" / "envs" / "cpu.txt"))


def test_this_environment_is_the_locked_one():
    assert lock_drift(read_lock(LOCK), installed_distributions()) == []


@pytest.mark.parametrize("text, message", [
    ("six==1.17.0\n", "six has no --hash lines"),
    ("six>=1.17\n    --hash=sha256:00\n", "is not an exact pin"),
])
def test_a_lock_without_exact_pins_and_hashes_is_refused(tmp_path, text, message):
    (tmp_path / "x.lock").write_text(text)
    with pytest.raises(PinError, match=message):
        read_lock(tmp_path / "x.lock")


def test_drift_names_each_package_locked_and_installed():
    rows = lock_drift({"six": "1.17.0", "numpy": "2.3.0", "qwen3-pilot": "0"},
                      {"six": "1.16.0", "numpy": "2.3.0", "left-pad": "1.0", "qwen3-pilot": "0.1.0"})
    assert rows == [{"package": "left-pad", "locked": "not locked", "installed": "1.0"},
                    {"package": "six", "locked": "1.17.0", "installed": "1.16.0"}]


def test_a_transitive_package_at_another_version_in_a_scratch_venv_fails_pin_env_naming_it(tmp_path):
    """A venv that sees this environment's packages (a .pth file) but has six, a dependency of a dependency
    (python-dateutil), at another version in its own site-packages, which wins on the path."""
    locked = read_lock(LOCK)
    assert "six" in locked and "six" not in read_pins(PROJECT / "workflow" / "envs" / "cpu.txt")
    other = "1.16.0" if locked["six"] != "1.16.0" else "1.15.0"
    scratch = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(scratch)], check=True)
    site = next(scratch.glob("lib/python*/site-packages"))
    (site / "pilot-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # six at another version as an installer leaves it (its metadata, which is what pin_env reads), made here
    # rather than installed from the package index.
    dist_info = site / f"six-{other}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: six\nVersion: {other}\n")
    (dist_info / "INSTALLER").write_text("pip\n")
    check = subprocess.run(
        [str(scratch / "bin" / "python"), "-c",
         "import sys; from pathlib import Path; from qwen3_pilot.stages.pin_env import check_lock; "
         "check_lock(Path(sys.argv[1]))", str(LOCK)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(PROJECT / "workflow" / "scripts")},
    )
    assert check.returncode != 0
    error = check.stderr.strip().splitlines()
    assert "the installed environment differs from" in check.stderr and "(1 package(s)" in check.stderr, check.stderr
    assert (error[-2].split() == ["package", "locked", "installed"]
            and error[-1].split() == ["six", locked["six"], other])
