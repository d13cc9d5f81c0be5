"""Pins: parsing envs/<backend>.txt, comparing with what is installed, and the per-package stamps."""

from __future__ import annotations

import json

import pytest
from conftest import PROJECT, output, run_snakemake

from qwen3_pilot.pins import NOT_INSTALLED, Pin, PinError, check_pin, installed_version, read_pins


def test_every_backend_pins_file_parses_and_pins_the_core_packages():
    for backend in ("cpu", "neuron"):
        pins = read_pins(PROJECT / "envs" / f"{backend}.txt")
        for package in ("torch", "torchtitan", "transformers", "safetensors", "huggingface-hub", "snakemake"):
            assert package in pins, (backend, package)
    neuron = read_pins(PROJECT / "envs" / "neuron.txt")
    assert neuron["torch"].specifier == "==2.14.0"
    assert neuron["torch-neuronx"].admits("2.14.3.0.1234") and not neuron["torch-neuronx"].admits("2.15.0")


def test_the_cpu_pins_are_what_this_environment_has():
    for pin in read_pins(PROJECT / "envs" / "cpu.txt").values():
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
    pins = ws / "envs" / "cpu.txt"
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
