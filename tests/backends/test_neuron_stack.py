"""workflow/envs/neuron-sdk/<release>.toml and what reads it (qwen3_pilot.backends.neuron.stack): each SDK release, its
components against AWS's published list, workflow/envs/neuron.txt beside it, the machine each release runs on, the
install's steps, the fork's commit as the install leaves it, and the record pin_env keeps. The install itself is
rehearsed in test_neuron_install.py; the release switch's rerun plan in test_neuron_release_switch.py."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
from conftest import PROJECT

from qwen3_pilot.backends.neuron.stack import (
    NOT_INSTALLED,
    UNRECORDED,
    StackError,
    component_changes,
    components_problems,
    known_releases,
    pin_problems,
    read_release,
    read_stack,
    release_admits,
)
from qwen3_pilot.backends.neuron.stack.install import install_steps, layer_on, machine_layout
from qwen3_pilot.backends.neuron.stack.installed import (
    check_record,
    editable_source,
    git_head,
    os_release_note,
    release_pins,
    releases_carrying,
    stack_record,
)
from qwen3_pilot.pins import read_pins
from qwen3_pilot.tools.preflight import PUBLISHED_COMPONENTS, PreflightError
from qwen3_pilot.tools.preflight.run import install_plan

STACK = read_release("2.33.0")
NEXT = read_release("2.34.0")
# A release as one reads before AWS's package list is: its compiler, NKI and OS packages unrecorded (2.34.0 was, until
# its release content page was read), for the tests of what an unrecorded value does.
UNREAD = dataclasses.replace(
    NEXT, python={**NEXT.python, "neuronx-cc": UNRECORDED, "nki": UNRECORDED},
    system={name: UNRECORDED for name in NEXT.system}, tools={name: UNRECORDED for name in NEXT.tools})
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def test_2_33_0_is_the_guides_tested_stack_and_awss_published_versions():
    assert known_releases() == ["2.33.0", "2.34.0"]
    published = (PUBLISHED_COMPONENTS / "sdk-2.33.0-components.md").read_text()
    assert components_problems(STACK, published) == []
    assert STACK.python["nki"] == "0.7.0" and STACK.python["neuronx-cc"] == "2.28.7631.0"
    assert STACK.framework == {"torch": "2.14.0"} and STACK.fork.ref == "release-2.33"
    assert STACK.machine.python == ("3.12", "3.13", "3.14") and STACK.machine.standalone_os == ("ubuntu 26.04",)
    assert STACK.machine.dlami_venv == "/opt/aws_neuronx_venv_torch_neuronx_2_14_0"


def test_2_34_0_holds_what_aws_published_and_marks_the_rest_unrecorded():
    published = (PUBLISHED_COMPONENTS / "sdk-2.34.0-components.md").read_text()
    assert components_problems(NEXT, published) == []
    assert NEXT.python["torch-neuronx"] == "2.14.3.1.*" and NEXT.released == "2026-11-30"
    assert NEXT.python["nki"] == "0.8.0" and NEXT.python["neuronx-cc"] == "2.29.16866.0"
    assert NEXT.system["aws-neuronx-runtime-lib"] == "2.36.8.0" and NEXT.tools == {"aws-neuronx-tools": "2.34.29.0"}
    assert not [name for name, version in NEXT.components().items() if UNRECORDED in version]
    assert NEXT.framework == {"torch": "2.14.0"} and NEXT.fork.version == "0.2.2+neuron.2"
    assert NEXT.machine.python == ("3.12", "3.13", "3.14")
    assert NEXT.machine.standalone_os == ("ubuntu 22.04", "ubuntu 24.04", "ubuntu 26.04")
    # The DLAMI's name and venv were on no page read: unrecorded, and so said in AWS's list as recorded.
    assert NEXT.machine.dlami is None and NEXT.machine.dlami_venv is None
    assert "| DLAMI | unrecorded name and venv;" in published


def test_a_version_the_published_list_does_not_have_is_named():
    published = (PUBLISHED_COMPONENTS / "sdk-2.33.0-components.md").read_text()
    older = dataclasses.replace(STACK, python={**STACK.python, "nki": "0.6.0"})
    assert components_problems(older, published) == ["nki 0.6.0: no row of the published list has version 0.6.0"]
    # An unrecorded version has nothing to compare: it is listed by the stack file, not looked up.
    unread = dataclasses.replace(STACK, python={**STACK.python, "nki": UNRECORDED})
    assert components_problems(unread, published) == []
    assert components_problems(dataclasses.replace(STACK, release="2.32.0"), published)[0].startswith(
        "the published list is not SDK 2.32.0's (its title: '# AWS Neuron SDK 2.33.0 (released 10/19/2026)")


@pytest.mark.parametrize("release", ["2.33.0", "2.34.0"])
def test_envs_neuron_txt_pins_no_component_of_any_release_and_not_the_fork(release):
    assert pin_problems(read_release(release), read_pins(PROJECT / "workflow" / "envs" / "neuron.txt")) == []


def test_a_neuron_txt_pinning_the_releases_components_is_refused_naming_each(tmp_path):
    before = tmp_path / "neuron.txt"
    before.write_text("torch==2.14.0\ntorch-neuronx==2.14.3.0.*\nnki==0.6.*\ntorchtitan==0.2.2+neuron.1\n"
                      "transformers==5.16.0\n")
    problems = pin_problems(STACK, read_pins(before))
    assert problems == [
        "workflow/envs/neuron.txt pins torch==2.14.0, a component of the Neuron SDK release: its version comes from "
        "workflow/envs/neuron-sdk/<release>.toml (SDK 2.33.0: 2.14.0)",
        "workflow/envs/neuron.txt pins torch-neuronx==2.14.3.0.*, a component of the Neuron SDK release: its version "
        "comes from workflow/envs/neuron-sdk/<release>.toml (SDK 2.33.0: 2.14.3.0.*)",
        "workflow/envs/neuron.txt pins nki==0.6.*, a component of the Neuron SDK release: its version comes from "
        "workflow/envs/neuron-sdk/<release>.toml (SDK 2.33.0: 0.7.0)",
        "workflow/envs/neuron.txt pins torchtitan, which no index serves: TorchTitan Neuron is installed from "
        f"https://github.com/aws-neuron/torchtitan-neuron.git ({STACK.path} [fork])",
    ]


def test_a_release_without_a_file_is_refused_naming_the_known_ones():
    with pytest.raises(StackError, match=r"^neuron.sdk = '2\.35\.0': there is no workflow/envs/neuron-sdk/2\.35\.0"
                                         r"\.toml; known releases: 2\.33\.0, 2\.34\.0$"):
        read_release("2.35.0")


def test_a_release_file_under_another_releases_name_is_refused(tmp_path):
    path = tmp_path / "2.34.0.toml"
    path.write_text(Path(STACK.path).read_text())
    with pytest.raises(StackError, match=r"\[sdk\] release = '2\.33\.0'; the file of a release is named after it"):
        read_stack(path)


@pytest.mark.parametrize("text, message", [
    ("", r"\[sdk\] is missing or empty"),
    ('[sdk]\nrelease = "2.33.0"\n', r"\[sdk\] released must be a non-empty string, got None"),
    ('[sdk]\nrelease = "2.33.0"\nreleased = "x"\nsources = ["https://a"]\n[indexes]\nextra = ["http://insecure"]\n',
     r"\[indexes\] extra must be a list of https:// URLs"),
    ('[sdk]\nrelease = "2.33.0"\nreleased = "x"\nsources = ["https://a"]\n[indexes]\nextra = ["https://b"]\n'
     '[framework]\ntorch = "2.14.0"\n[python]\nnki = "latest"\n',
     r"\[python\] nki = 'latest' is not a version like 2\.28\.7631\.0 or 'unrecorded'"),
    ("[sdk\n", "cannot read the Neuron stack file"),
])
def test_a_broken_stack_file_is_refused_naming_the_file_and_key(tmp_path, text, message):
    path = tmp_path / "2.33.0.toml"
    path.write_text(text)
    with pytest.raises(StackError, match=rf"^{path}: .*{message}"):
        read_stack(path)


@pytest.mark.parametrize("release, installed, admitted", [
    ("2.14.3.0.*", "2.14.3.0", True), ("2.14.3.0.*", "2.14.3.0.2451+cpu", True), ("2.14.3.0.*", "2.14.30.0", False),
    ("2.28.7631.0", "2.28.7631.0+f702b353", True), ("2.28.7631.0", "2.27.5334.0", False),
    ("2.31.7.0", "2.31.7.0-1", True), ("0.7.0", "0.7.01", False), (UNRECORDED, "0.7.0", False),
    (UNRECORDED, UNRECORDED, False),
])
def test_a_release_version_admits_its_builds_and_nothing_else(release, installed, admitted):
    assert release_admits(release, installed) is admitted


def os_root(tmp_path: Path, os_release: str, dlami_python: str | None = None) -> Path:
    """A file system root with /etc/os-release and, given a Python version, 2.33.0's DLAMI venv of it."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "os-release").write_text(os_release)
    if dlami_python:
        venv = root / STACK.machine.dlami_venv.lstrip("/")
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "python").touch()
        (venv / "lib" / f"python{dlami_python}" / "site-packages").mkdir(parents=True)
    return root


UBUNTU_26 = 'PRETTY_NAME="Ubuntu 26.04 LTS"\nID=ubuntu\nVERSION_ID="26.04"\n'
UBUNTU_24 = 'ID=ubuntu\nVERSION_ID="24.04"\n'


def python_is(version: str):
    return lambda python: version


def test_on_the_releases_dlami_the_venv_is_built_on_awss_venv(tmp_path):
    root = os_root(tmp_path, UBUNTU_24, "3.12")
    layout = machine_layout(STACK, root, "python3", python_is("3.12"))
    venv = root / "opt" / "aws_neuronx_venv_torch_neuronx_2_14_0"
    assert (layout.kind, layout.os, layout.base_python, layout.dlami_venv) == (
        "dlami", "ubuntu 24.04", str(venv / "bin" / "python"), venv)


def test_on_plain_ubuntu_26_04_the_standalone_wheels_are_installed(tmp_path):
    layout = machine_layout(STACK, os_root(tmp_path, UBUNTU_26), "python3.13", python_is("3.13"))
    assert (layout.kind, layout.os, layout.base_python, layout.dlami_venv) == (
        "standalone", "ubuntu 26.04", "python3.13", None)


def test_another_os_is_refused_naming_it_the_supported_ones_and_the_dlami(tmp_path):
    with pytest.raises(StackError) as refused:
        machine_layout(STACK, os_root(tmp_path, 'ID=debian\nVERSION_ID="12"\n'), "python3", python_is("3.12"))
    message = str(refused.value)
    assert message.startswith("this machine runs debian 12: SDK 2.33.0's standalone wheels are built for ubuntu "
                              "26.04 only, and its DLAMI \"Deep Learning AMI Neuron torch-neuronx 2.14.0\" (ubuntu "
                              "24.04, ubuntu 26.04) with AWS's venv /opt/aws_neuronx_venv_torch_neuronx_2_14_0, which "
                              "is not on this machine"), message
    assert "https://github.com/aws-neuron/torch-neuronx/releases/tag/v2.33.0" in message
    # Ubuntu 24.04 without the DLAMI's venv: the wheels are not built for it.
    with pytest.raises(StackError, match="this machine runs ubuntu 24.04"):
        machine_layout(STACK, os_root(tmp_path / "24", UBUNTU_24), "python3", python_is("3.12"))


def test_an_unsupported_python_is_refused_naming_it_and_the_supported_ones(tmp_path):
    supported = r"SDK 2\.33\.0 supports Python 3\.12, 3\.13, 3\.14 "
    with pytest.raises(StackError, match=rf"^python3 is Python 3\.11; {supported}"):
        machine_layout(STACK, os_root(tmp_path, UBUNTU_26), "python3", python_is("3.11"))
    # On the DLAMI the venv's Python is AWS's, not the one NEURON_PYTHON names: that is the one checked.
    root = os_root(tmp_path / "d", UBUNTU_24, "3.11")
    dlami_python = str(root / STACK.machine.dlami_venv.lstrip("/") / "bin" / "python")
    with pytest.raises(StackError, match=rf"^{dlami_python} is Python 3\.11; {supported}"):
        machine_layout(STACK, root, "python3", lambda python: "3.11" if python == dlami_python else "3.12")


def test_a_release_whose_machine_is_unrecorded_is_refused_until_recorded(tmp_path):
    unread = dataclasses.replace(NEXT, machine=dataclasses.replace(NEXT.machine, standalone_os=None))
    with pytest.raises(StackError, match=r"SDK 2\.34\.0's supported OS is unrecorded in .*2\.34\.0\.toml \[machine\]"):
        machine_layout(unread, os_root(tmp_path, UBUNTU_26), "python3", python_is("3.12"))


def test_the_layer_makes_the_venv_import_awss_venv_after_its_own(tmp_path):
    venv, base = tmp_path / "venv", tmp_path / "aws"
    (venv / "lib" / "python3.12" / "site-packages").mkdir(parents=True)
    (base / "lib" / "python3.12" / "site-packages").mkdir(parents=True)
    pth = layer_on(venv, base)
    assert pth.read_text() == f"{base / 'lib' / 'python3.12' / 'site-packages'}\n"
    other = tmp_path / "aws-3.13"
    (other / "lib" / "python3.13" / "site-packages").mkdir(parents=True)
    with pytest.raises(StackError, match="holds no site-packages for python3.12"):
        layer_on(venv, other)


def test_the_install_runs_in_awss_order_and_nothing_after_the_packages_moves_a_pin(tmp_path):
    root = os_root(tmp_path, UBUNTU_26)
    venv = tmp_path / ".venv-neuron"
    steps = install_steps(STACK, machine_layout(STACK, root, "python3.12", python_is("3.12")), venv, tmp_path)
    commands = [step.command for step in steps]
    requirements, pins = str(venv / "neuron-sdk-2.33.0.txt"), str(tmp_path / "workflow" / "envs" / "neuron.txt")
    assert commands[0] == ["python3.12", "-m", "venv", str(venv)]
    assert commands[1] == ["write", requirements] and steps[1].action is not None
    assert commands[2][-8:] == ["-r", requirements, "-r", pins, "--extra-index-url",
                                "https://pip.repos.neuron.amazonaws.com", "--extra-index-url",
                                "https://download.pytorch.org/whl/cpu"]
    clone = str(tmp_path / "vendor" / "torchtitan-neuron")
    assert commands[3] == ["git", "clone", "--no-checkout", STACK.fork.url, clone]
    assert commands[4][-2:] == ["origin", "release-2.33"] and commands[5][-2:] == ["--detach", "FETCH_HEAD"]
    for command in commands[6:8]:  # the fork's requirements and the fork: the release and workflow/envs/neuron.txt bind
        assert command[command.index("-c"):][:4] == ["-c", requirements, "-c", pins]
    assert commands[8][-3:] == ["--no-deps", "-e", str(tmp_path)]
    assert commands[-2][-2:] == ["pip", "check"] and commands[-1][-3:] == ["--sdk", "2.33.0", "record"]
    venv.mkdir()  # step 1 made it
    steps[1].action()
    assert Path(requirements).read_text().splitlines() == [
        "torch==2.14.0", "torch-neuronx==2.14.3.0.*", "neuronx-cc==2.28.7631.0", "nki==0.7.0"]
    # With the release's lock made on an instance, the packages step installs it, hashes checked.
    (tmp_path / "workflow" / "envs" / "neuron-sdk").mkdir(parents=True)
    (tmp_path / "workflow" / "envs" / "neuron-sdk" / "2.33.0.lock").write_text("")
    third = install_steps(STACK, machine_layout(STACK, root, "python3.12", python_is("3.12")), venv, tmp_path)[2]
    assert third.command[third.command.index("--require-hashes"):][:3] == [
        "--require-hashes", "-r", str(tmp_path / "workflow" / "envs" / "neuron-sdk" / "2.33.0.lock")]


def test_on_the_dlami_the_install_layers_the_venv_before_installing(tmp_path):
    layout = machine_layout(STACK, os_root(tmp_path, UBUNTU_24, "3.12"), "python3", python_is("3.12"))
    steps = install_steps(STACK, layout, tmp_path / "v", tmp_path)
    assert steps[0].command[0] == layout.base_python
    assert steps[1].what.startswith(f"on AWS's venv {layout.dlami_venv}") and steps[1].action is not None


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


RELEASED = {"torch": "2.14.0+cpu", "torch_neuronx": "2.14.3.0.77", "neuronx_cc": "2.28.7631.0+f1", "nki": "0.7.0",
            "torchtitan": "0.2.2+neuron.1"}


def test_the_record_holds_every_component_and_the_forks_commit():
    record = stack_record(STACK, versions(**RELEASED), dict(STACK.os_packages), COMMIT)
    assert record["ok"] and record["fork_commit"] == COMMIT and not record["fork_pinned"]
    rows = {row["component"]: row for row in record["components"]}
    assert set(rows) == {"torch", *STACK.python, *STACK.system, *STACK.tools, "torchtitan"}
    assert rows["torchtitan"]["installed"] == f"0.2.2+neuron.1 @ {COMMIT}"
    check_record(record)  # does not raise


def test_a_component_off_the_release_fails_the_record_naming_it():
    record = stack_record(STACK, versions(**{**RELEASED, "nki": "0.6.0"}), dict(STACK.os_packages), COMMIT)
    assert not record["ok"]
    with pytest.raises(StackError, match=r"not SDK 2\.33\.0's.*\n.*\nnki +0\.7\.0 +0\.6\.0 +DIFFERS"):
        check_record(record)
    # An OS package the machine lacks, and a fork with no commit (not a git clone), fail too.
    record = stack_record(STACK, versions(**RELEASED), {}, None)
    failing = {row["component"] for row in record["components"] if not row["ok"]}
    assert failing == {*STACK.os_packages, "torchtitan"}


def test_an_unrecorded_version_fails_the_record_whatever_is_installed():
    record = stack_record(UNREAD, versions(**RELEASED), dict(STACK.os_packages), COMMIT)
    failing = {row["component"] for row in record["components"] if not row["ok"]}
    # torch 2.14.0 is 2.34.0's too; torch-neuronx and the fork moved; the rest is unrecorded.
    assert failing == {"torch-neuronx", "neuronx-cc", "nki", *NEXT.os_packages, "torchtitan"}
    with pytest.raises(StackError, match="an unrecorded version is never taken as the release's"):
        check_record(record)


def test_an_instance_on_another_release_is_named_with_the_one_line_fix():
    stacks = [STACK, NEXT]
    on_2_33 = {name: f"{version}-1" for name, version in STACK.os_packages.items()}
    assert releases_carrying(on_2_33, stacks) == ["2.33.0"]
    assert releases_carrying(on_2_33, [STACK, UNREAD]) == ["2.33.0"]  # unrecorded versions claim nothing
    on_2_34 = {name: f"{version}-1" for name, version in NEXT.os_packages.items()}
    assert releases_carrying(on_2_34, stacks) == ["2.34.0"]
    assert os_release_note(STACK, stack_record(STACK, versions(**RELEASED), on_2_34, COMMIT), stacks).endswith(
        "set neuron.sdk: 2.34.0 (config/trn2.yaml), or launch SDK 2.33.0's DLAMI (Deep Learning AMI Neuron "
        "torch-neuronx 2.14.0)")
    record = stack_record(NEXT, versions(**RELEASED), on_2_33, COMMIT)
    note = os_release_note(NEXT, record, stacks)
    assert note.startswith("this instance carries SDK 2.33.0's OS packages (aws-neuronx-dkms 2.31.7.0-1, ")
    assert note.endswith("set neuron.sdk: 2.33.0 (config/trn2.yaml), or launch SDK 2.34.0's DLAMI (unrecorded)")
    moved = {**on_2_33, "aws-neuronx-runtime-lib": "2.99.0.0"}
    note = os_release_note(STACK, stack_record(STACK, versions(**RELEASED), moved, COMMIT), stacks)
    assert "belong to no release recorded in workflow/envs/neuron-sdk/ (2.33.0, 2.34.0): launch SDK 2.33.0's DLAMI " \
           "(Deep Learning AMI Neuron torch-neuronx 2.14.0)" in note
    assert os_release_note(STACK, stack_record(STACK, versions(**RELEASED), on_2_33, COMMIT), stacks) is None


def test_a_fork_pinned_to_a_commit_must_be_at_that_commit():
    pinned = dataclasses.replace(STACK, fork=dataclasses.replace(STACK.fork, ref=COMMIT))
    assert pinned.fork.pinned
    system = dict(STACK.os_packages)
    assert stack_record(pinned, versions(**RELEASED), system, COMMIT)["ok"]
    assert not stack_record(pinned, versions(**RELEASED), system, "f" * 40)["ok"]


def test_the_releases_pip_components_and_fork_are_pinned_for_the_stages():
    pins = release_pins(STACK)
    assert set(pins) == {"torch", "torch-neuronx", "neuronx-cc", "nki", "torchtitan"}
    assert pins["torchtitan"].admits("0.2.2+neuron.1") and not pins["torchtitan"].admits("0.3.0")
    assert pins["torch-neuronx"].admits("2.14.3.0.1234") and not pins["torch-neuronx"].admits("2.14.3.1.5")
    unrecorded = release_pins(UNREAD)["nki"]
    assert unrecorded.specifier == UNRECORDED and not unrecorded.admits("0.7.0")


def test_the_switch_to_2_34_0_lists_each_component_that_moved():
    changes = {row["component"]: (row["from"], row["to"]) for row in component_changes(STACK, NEXT)}
    assert changes["torch-neuronx"] == ("2.14.3.0.*", "2.14.3.1.*")
    assert changes["torchtitan"] == ("0.2.2+neuron.1 @ release-2.33", "0.2.2+neuron.2 @ main")
    assert changes["nki"] == ("0.7.0", "0.8.0") and changes["aws-neuronx-tools"] == ("2.33.38.0", "2.34.29.0")
    # torch 2.14.0 in both; every other component moved.
    assert set(changes) == set(NEXT.components()) - {"torch"}
    assert component_changes(STACK, STACK) == []


def test_the_preflight_names_the_release_and_the_forks_ref_and_checks_the_plan(tmp_path):
    plan = install_plan(PROJECT, "2.33.0")
    assert plan["sdk_release"] == "2.33.0" and plan["published_list"].endswith("sdk-2.33.0-components.md")
    assert plan["fork"] == "https://github.com/aws-neuron/torchtitan-neuron.git @ release-2.33"
    assert not plan["unrecorded"]
    assert install_plan(PROJECT, "2.34.0")["unrecorded"] == []
    project = tmp_path / "project"
    (project / "workflow" / "envs" / "neuron-sdk").mkdir(parents=True)
    for name in ("neuron-sdk/2.33.0.toml", "neuron.txt"):
        (project / "workflow" / "envs" / name).write_text((PROJECT / "workflow" / "envs" / name).read_text())
    pins = project / "workflow" / "envs" / "neuron.txt"
    pins.write_text(pins.read_text() + "nki==0.6.0\n")
    with pytest.raises(PreflightError, match=r"pins nki==0\.6\.0, a component of the Neuron SDK release"):
        install_plan(project, "2.33.0")


def test_a_pinned_package_installed_from_a_git_clone_records_its_commit_in_its_stamp(tmp_path, monkeypatch):
    from qwen3_pilot.backends.neuron.stack import installed
    from qwen3_pilot.stages.pin_env import run_package

    clone = tmp_path / "clone"
    clone.mkdir()
    git(clone, "init", "-q", "-b", "main")
    git(clone, "commit", "-q", "--allow-empty", "-m", "fork")
    monkeypatch.setattr(installed, "editable_source", lambda name: clone if name == "pyyaml" else None)
    stamped = run_package("pyyaml", f"=={__import__('yaml').__version__}", tmp_path / "pyyaml.json")
    assert stamped["commit"] == git(clone, "rev-parse", "HEAD")
    assert "commit" not in run_package("packaging", f"=={__import__('packaging').__version__}", tmp_path / "p.json")


@pytest.mark.parametrize("release", ["2.33.0", "2.34.0"])
def test_the_conda_env_uses_the_release_files_indexes(release):
    import yaml

    env = yaml.safe_load((PROJECT / "workflow" / "envs" / "neuron.yaml").read_text())
    (pip,) = [d["pip"] for d in env["dependencies"] if isinstance(d, dict)]
    indexes = [option for line in pip if line.startswith("--") for option in line.split()]
    assert indexes == read_release(release).index_options()


def test_an_os_package_stamp_passes_at_the_releases_version_and_names_the_release_the_instance_carries(tmp_path):
    from qwen3_pilot.pins import PinError
    from qwen3_pilot.stages.pin_env import run_os_package

    def reads(version):
        return lambda packages: {package: version for package in packages}

    stamp = tmp_path / "runtime.json"
    row = run_os_package("aws-neuronx-runtime-lib", "2.35.30.0", stamp, PROJECT, reads("2.35.30.0-1"))
    assert row["ok"] and json.loads(stamp.read_text())["installed"] == "2.35.30.0-1"
    # 2.34.0 chosen on an instance with 2.33.0's runtime: the stamp fails, nothing written, the release named.
    failed = tmp_path / "failed.json"
    with pytest.raises(PinError, match=r"pins unrecorded, this instance has 2\.35\.30\.0-1: 2\.35\.30\.0-1 is SDK "
                                       r"2\.33\.0's: set neuron\.sdk: 2\.33\.0 \(config/trn2\.yaml\)"):
        run_os_package("aws-neuronx-runtime-lib", UNRECORDED, failed, PROJECT, reads("2.35.30.0-1"))
    with pytest.raises(PinError, match=r"no release recorded in workflow/envs/neuron-sdk/ \(2\.33\.0, 2\.34\.0\) "
                                      r"ships not "):
        run_os_package("aws-neuronx-runtime-lib", "2.35.30.0", failed, PROJECT, reads("not found"))
    assert not failed.exists()


def test_a_pip_stamp_of_an_unrecorded_version_fails_naming_the_installed_one(tmp_path):
    from qwen3_pilot.pins import PinError
    from qwen3_pilot.stages.pin_env import run_package

    with pytest.raises(PinError, match=r"packaging: the Neuron SDK release file .* records no version for it "
                                       r"\(unrecorded\); this environment has \d"):
        run_package("packaging", UNRECORDED, tmp_path / "packaging.json")
    assert not (tmp_path / "packaging.json").exists()
