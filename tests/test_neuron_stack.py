"""envs/neuron-sdk.toml and what reads it (qwen3_pilot.neuron_stack): the SDK release, its components against
AWS's published list, envs/neuron.txt against the release, the install's steps, the fork's commit as the
install leaves it, and the record pin_env keeps. The install itself is rehearsed in test_neuron_install.py."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
from conftest import PROJECT

from qwen3_pilot.neuron_stack import (
    NOT_INSTALLED,
    StackError,
    check_record,
    components_problems,
    editable_source,
    fork_pins,
    git_head,
    install_steps,
    pin_problems,
    read_stack,
    release_admits,
    stack_record,
)
from qwen3_pilot.pins import read_pins
from qwen3_pilot.tools.preflight import PUBLISHED_COMPONENTS, PreflightError, install_plan

STACK = read_stack()
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def test_the_stack_names_sdk_2_33_0_and_its_versions_are_awss_published_ones():
    assert STACK.release == "2.33.0"
    published = (PUBLISHED_COMPONENTS / "sdk-2.33.0-components.md").read_text()
    assert components_problems(STACK, published) == []
    assert STACK.python["nki"] == "0.7.0" and STACK.python["neuronx-cc"] == "2.28.7631.0"


def test_a_version_the_published_list_does_not_have_is_named():
    published = (PUBLISHED_COMPONENTS / "sdk-2.33.0-components.md").read_text()
    older = dataclasses.replace(STACK, python={**STACK.python, "nki": "0.6.0"})
    assert components_problems(older, published) == ["nki 0.6.0: no row of the published list has version 0.6.0"]
    assert components_problems(dataclasses.replace(STACK, release="2.32.0"), published)[0].startswith(
        "the published list is not SDK 2.32.0's (its title: '# AWS Neuron SDK 2.33.0 (released 10/19/2026)")


def test_envs_neuron_txt_pins_the_releases_packages_and_not_the_fork():
    assert pin_problems(STACK, read_pins(PROJECT / "envs" / "neuron.txt")) == []


def test_the_neuron_txt_that_stopped_the_install_is_refused_naming_each_problem(tmp_path):
    before = tmp_path / "neuron.txt"
    before.write_text("torch==2.14.0\ntorch-neuronx==2.14.3.*\nneuronx-cc==2.*\nnki==0.6.*\ntorchtitan==0.2.2+neuron.1\n")
    problems = pin_problems(STACK, read_pins(before))
    assert problems == [
        "envs/neuron.txt pins torch-neuronx==2.14.3.*; SDK 2.33.0 ships torch-neuronx 2.14.3.0.* "
        f"({STACK.path} [python])",
        f"envs/neuron.txt pins neuronx-cc==2.*; SDK 2.33.0 ships neuronx-cc 2.28.7631.0 ({STACK.path} [python])",
        f"envs/neuron.txt pins nki==0.6.*; SDK 2.33.0 ships nki 0.7.0 ({STACK.path} [python])",
        "envs/neuron.txt pins torchtitan, which no index serves: TorchTitan Neuron is installed from "
        f"https://github.com/aws-neuron/torchtitan-neuron.git ({STACK.path} [fork])",
    ]


@pytest.mark.parametrize("text, message", [
    ("", r"\[sdk\] is missing or empty"),
    ('[sdk]\nrelease = "2.33.0"\n', r"\[sdk\] released must be a non-empty string, got None"),
    ('[sdk]\nrelease = "2.33.0"\nreleased = "x"\n[indexes]\nextra = ["http://insecure"]\n',
     r"\[indexes\] extra must be a list of https:// URLs"),
    ('[sdk]\nrelease = "2.33.0"\nreleased = "x"\n[indexes]\nextra = []\n[python]\nnki = "latest"\n',
     r"\[python\] nki = 'latest' is not a version"),
    ("[sdk\n", "cannot read the Neuron stack file"),
])
def test_a_broken_stack_file_is_refused_naming_the_file_and_key(tmp_path, text, message):
    path = tmp_path / "neuron-sdk.toml"
    path.write_text(text)
    with pytest.raises(StackError, match=rf"^{path}: .*{message}"):
        read_stack(path)


@pytest.mark.parametrize("release, installed, admitted", [
    ("2.14.3.0.*", "2.14.3.0", True), ("2.14.3.0.*", "2.14.3.0.2451+cpu", True), ("2.14.3.0.*", "2.14.30.0", False),
    ("2.28.7631.0", "2.28.7631.0+f702b353", True), ("2.28.7631.0", "2.27.5334.0", False),
    ("2.31.7.0", "2.31.7.0-1", True), ("0.7.0", "0.7.01", False),
])
def test_a_release_version_admits_its_builds_and_nothing_else(release, installed, admitted):
    assert release_admits(release, installed) is admitted


def test_the_install_runs_in_awss_order_and_nothing_after_the_first_step_moves_a_pin(tmp_path):
    steps = install_steps(STACK, "/venv/bin/python", tmp_path)
    commands = [step.command for step in steps]
    assert commands[0][-6:-4] == ["-r", str(tmp_path / "envs" / "neuron.txt")]
    assert commands[0][-4:] == ["--extra-index-url", "https://pip.repos.neuron.amazonaws.com",
                                "--extra-index-url", "https://download.pytorch.org/whl/cpu"]
    clone = str(tmp_path / "vendor" / "torchtitan-neuron")
    assert commands[1] == ["git", "clone", "--no-checkout", STACK.fork.url, clone]
    assert commands[2][-2:] == ["origin", STACK.fork.ref] and commands[3][-2:] == ["--detach", "FETCH_HEAD"]
    for command in commands[4:6]:  # the fork's requirements and the fork: envs/neuron.txt as constraints
        assert command[command.index("-c") + 1] == str(tmp_path / "envs" / "neuron.txt")
    assert commands[6][-3:] == ["--no-deps", "-e", str(tmp_path)]
    assert commands[-2][-2:] == ["pip", "check"]
    # With a lock made on an instance, the first step installs it, hashes checked.
    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / "neuron.lock").write_text("")
    first = install_steps(STACK, "/venv/bin/python", tmp_path)[0].command
    assert first[first.index("--require-hashes"):][:3] == ["--require-hashes", "-r", str(tmp_path / "envs" /
                                                                                          "neuron.lock")]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def test_the_checked_out_commit_is_read_from_the_clones_files(tmp_path):
    repo = tmp_path / "clone"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "f").write_text("1")
    git(repo, "add", "f")
    git(repo, "commit", "-q", "-m", "one")
    first = git(repo, "rev-parse", "HEAD")
    assert git_head(repo) == first  # on a branch, from refs/heads/main
    git(repo, "pack-refs", "--all")
    assert not (repo / ".git" / "refs" / "heads" / "main").exists() and git_head(repo) == first  # packed
    (repo / "f").write_text("2")
    git(repo, "commit", "-q", "-am", "two")
    git(repo, "checkout", "-q", "--detach", first)
    assert git_head(repo) == first  # detached, as the install leaves it
    assert git_head(tmp_path) is None


def test_the_fork_source_is_the_editable_installs_folder():
    clone = PROJECT / "vendor" / "torchtitan-neuron"
    record = {"url": clone.as_uri(), "dir_info": {"editable": True}}
    assert editable_source("torchtitan", lambda d, n: json.dumps(record)) == clone
    assert editable_source("torchtitan", lambda d, n: json.dumps({**record, "dir_info": {}})) is None
    assert editable_source("torchtitan", lambda d, n: None) is None  # a wheel install (the cpu backend's)


def versions(**installed):
    return lambda name: installed.get(name.replace("-", "_"), NOT_INSTALLED)


RELEASED = {"torch_neuronx": "2.14.3.0.77", "neuronx_cc": "2.28.7631.0+f1", "nki": "0.7.0",
            "torchtitan": "0.2.2+neuron.1"}


def test_the_record_holds_every_component_and_the_forks_commit():
    system = {name: version for name, version in STACK.system.items()}
    record = stack_record(STACK, versions(**RELEASED), system, COMMIT)
    assert record["ok"] and record["fork_commit"] == COMMIT and not record["fork_pinned"]
    rows = {row["component"]: row for row in record["components"]}
    assert set(rows) == {*STACK.python, *STACK.system, "torchtitan"}
    assert rows["torchtitan"]["installed"] == f"0.2.2+neuron.1 @ {COMMIT}"
    check_record(record)  # does not raise


def test_a_component_off_the_release_fails_the_record_naming_it():
    record = stack_record(STACK, versions(**{**RELEASED, "nki": "0.6.0"}), dict(STACK.system), COMMIT)
    assert not record["ok"]
    with pytest.raises(StackError, match=r"not SDK 2\.33\.0's.*\n.*\nnki +0\.7\.0 +0\.6\.0 +DIFFERS"):
        check_record(record)
    # An OS package the machine lacks, and a fork with no commit (not a git clone), fail too.
    record = stack_record(STACK, versions(**RELEASED), {}, None)
    failing = {row["component"] for row in record["components"] if not row["ok"]}
    assert failing == {*STACK.system, "torchtitan"}


def test_a_fork_pinned_to_a_commit_must_be_at_that_commit():
    pinned = dataclasses.replace(STACK, fork=dataclasses.replace(STACK.fork, ref=COMMIT))
    assert pinned.fork.pinned
    system = dict(STACK.system)
    assert stack_record(pinned, versions(**RELEASED), system, COMMIT)["ok"]
    assert not stack_record(pinned, versions(**RELEASED), system, "f" * 40)["ok"]


def test_the_fork_is_pinned_for_the_stages_beside_envs_neuron_txt():
    (pin,) = fork_pins(STACK).values()
    assert pin.package == "torchtitan" and pin.admits("0.2.2+neuron.1") and not pin.admits("0.3.0")


def test_the_preflight_checks_the_install_plan_against_the_published_list(tmp_path):
    plan = install_plan(PROJECT)
    assert plan["sdk_release"] == "2.33.0" and plan["published_list"].endswith("sdk-2.33.0-components.md")
    project = tmp_path / "project"
    (project / "envs").mkdir(parents=True)
    for name in ("neuron-sdk.toml", "neuron.txt"):
        (project / "envs" / name).write_text((PROJECT / "envs" / name).read_text())
    pins = project / "envs" / "neuron.txt"
    pins.write_text(pins.read_text().replace("nki==0.7.0", "nki==0.6.*"))
    with pytest.raises(PreflightError, match=r"pins nki==0\.6\.\*; SDK 2\.33\.0 ships nki 0\.7\.0"):
        install_plan(project)


def test_a_pinned_package_installed_from_a_git_clone_records_its_commit_in_its_stamp(tmp_path, monkeypatch):
    from qwen3_pilot import neuron_stack
    from qwen3_pilot.stages.pin_env import run_package

    clone = tmp_path / "clone"
    clone.mkdir()
    git(clone, "init", "-q", "-b", "main")
    git(clone, "commit", "-q", "--allow-empty", "-m", "fork")
    monkeypatch.setattr(neuron_stack, "editable_source", lambda name: clone if name == "pyyaml" else None)
    stamped = run_package("pyyaml", f"=={__import__('yaml').__version__}", tmp_path / "pyyaml.json")
    assert stamped["commit"] == git(clone, "rev-parse", "HEAD")
    assert "commit" not in run_package("packaging", f"=={__import__('packaging').__version__}", tmp_path / "p.json")


def test_the_conda_env_uses_the_stack_files_indexes():
    import yaml

    env = yaml.safe_load((PROJECT / "envs" / "neuron.yaml").read_text())
    (pip,) = [d["pip"] for d in env["dependencies"] if isinstance(d, dict)]
    assert [option for line in pip if line.startswith("--") for option in line.split()] == STACK.index_options()
