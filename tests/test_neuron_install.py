"""The trn2 install rehearsed on this machine: `make install-neuron` (qwen3_pilot.neuron_stack install) and
`make lock-neuron`, against a local package folder holding stand-ins with exactly the names and
versions of AWS's SDK 2.33.0 list and of envs/neuron.txt, and a local git repository standing in for the
TorchTitan Neuron fork (git's url.<base>.insteadOf sends the stack file's GitHub URL there). pip is kept off
every index (PIP_NO_INDEX) and reads only that folder (PIP_FIND_LINKS), so the real commands and the real
envs/ files run, nothing reaches the network, and the installed stack is the stand-ins'.

The same rehearsal with either defect issue 19 found in envs/neuron.txt (torchtitan==0.2.2+neuron.1, which no index
serves; nki==0.6.*, SDK 2.32's NKI, where 2.33 ships 0.7.0) fails at its first step, as the trn2 install would.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from conftest import PROJECT, venv_env

from qwen3_pilot.neuron_stack import FORK_CLONE, read_stack

# AWS's SDK 2.33.0 pip components as its release notes list them (workflow/resources/neuron/sdk-2.33.0-components.md):
# what AWS's repository would serve. libneuronxla is listed but not installed by AWS's 2.33 command.
AWS_2_33_0 = {"torch-neuronx": "2.14.3.0", "neuronx-cc": "2.28.7631.0", "nki": "0.7.0",
              "libneuronxla": "3.0.10135.0"}


def record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def write_wheel(folder: Path, name: str, version: str, files: dict[str, bytes] | None = None) -> Path:
    """A wheel of `name` `version` holding `files` (default: one empty module), with its METADATA, WHEEL and
    RECORD: what pip needs to install it."""
    normal = re.sub(r"[-_.]+", "_", name).lower()
    files = dict(files or {f"{normal}_stand_in.py": b""})
    dist_info = f"{normal}-{version}.dist-info"
    files[f"{dist_info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    files[f"{dist_info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = [record_line(path, data) for path, data in files.items()] + [f"{dist_info}/RECORD,,"]
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = folder / f"{normal}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return wheel


def wheel_of_installed(folder: Path, name: str) -> Path:
    """The installed distribution `name` packed back into a wheel (the project's build needs a real
    setuptools, and the rehearsal reaches no index for one)."""
    distribution = metadata.distribution(name)
    files = {}
    for entry in distribution.files or ():
        path = str(entry)
        if "__pycache__" in path or path.startswith("..") or path.endswith("RECORD") or ".dist-info/" in path:
            continue
        files[path] = Path(distribution.locate_file(entry)).read_bytes()
    for extra in ("entry_points.txt", "top_level.txt"):
        text = distribution.read_text(extra)
        if text:
            files[f"{name}-{distribution.version}.dist-info/{extra}"] = text.encode()
    return write_wheel(folder, name, distribution.version, files)


# A build backend in the stand-in fork's own tree (PEP 517 backend-path): its editable build needs nothing
# from an index. The editable wheel is a .pth file naming the tree, as setuptools' simplest mode makes it.
FORK_BACKEND = '''
import base64, hashlib, os, zipfile

NAME, VERSION = "torchtitan", "{version}"
DIST_INFO = f"{{NAME}}-{{VERSION}}.dist-info"


def _line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{{path}},sha256={{digest}},{{len(data)}}"


def get_requires_for_build_editable(config_settings=None):
    return []


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    files = {{
        "torchtitan_stand_in.pth": (os.path.abspath(".") + "\\n").encode(),
        f"{{DIST_INFO}}/METADATA": f"Metadata-Version: 2.1\\nName: {{NAME}}\\nVersion: {{VERSION}}\\n".encode(),
        f"{{DIST_INFO}}/WHEEL": b"Wheel-Version: 1.0\\nGenerator: t\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
    }}
    record = [_line(p, d) for p, d in files.items()] + [f"{{DIST_INFO}}/RECORD,,"]
    files[f"{{DIST_INFO}}/RECORD"] = ("\\n".join(record) + "\\n").encode()
    name = f"{{NAME}}-{{VERSION}}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return name
'''


def make_fork(root: Path, version: str) -> tuple[Path, str]:
    """A git repository shaped like TorchTitan Neuron's install surface: requirements.txt, a pyproject whose
    editable install provides `torchtitan` `version`, the packages torchtitan and torchtitan_neuron. Returns
    the repository and its commit."""
    (root / "torchtitan").mkdir(parents=True)
    (root / "torchtitan" / "__init__.py").write_text("")
    (root / "torchtitan_neuron").mkdir()
    (root / "torchtitan_neuron" / "__init__.py").write_text("")
    (root / "requirements.txt").write_text("torch\nsafetensors\n")  # pinned by envs/neuron.txt as constraints
    (root / "stand_in_backend.py").write_text(FORK_BACKEND.format(version=version))
    (root / "pyproject.toml").write_text('[build-system]\nrequires = []\nbuild-backend = "stand_in_backend"\n'
                                         'backend-path = ["."]\n')
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    for command in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "stand-in"]):
        subprocess.run([*git, *command], check=True, capture_output=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    return root, commit


def stand_in_index(folder: Path) -> Path:
    """Every distribution the install asks for, at the versions envs/neuron.txt pins and AWS's 2.33.0 list
    names (none of them real), and a real setuptools for the project's own build."""
    folder.mkdir()
    from qwen3_pilot.pins import read_pins

    for name, pin in read_pins(PROJECT / "envs" / "neuron.txt").items():
        if name not in AWS_2_33_0:
            write_wheel(folder, name, pin.specifier.removeprefix("=="))
    for name, version in AWS_2_33_0.items():
        write_wheel(folder, name, version)
    wheel_of_installed(folder, "setuptools")
    return folder


@pytest.fixture
def rehearsal(tmp_path):
    """A copy of the project (its envs/ as committed), the stand-in index and fork, and the environment that
    keeps pip and git on them."""
    project = tmp_path / "project"
    shutil.copytree(PROJECT, project, ignore=shutil.ignore_patterns(
        ".venv", ".venv-neuron", ".git", "results", "logs", ".snakemake", ".cache", "vendor", "__pycache__",
        "*.egg-info"))
    stack = read_stack(project / "envs" / "neuron-sdk.toml")
    fork, commit = make_fork(tmp_path / "fork", stack.fork.version)
    index = stand_in_index(tmp_path / "index")
    env = {**venv_env(), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index), "PIP_NO_CACHE_DIR": "1",
           # git fetches the stack file's URL from the stand-in repository instead.
           "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": f"url.{fork.as_uri()}.insteadOf",
           "GIT_CONFIG_VALUE_0": stack.fork.url}
    return {"project": project, "python": str(project / ".venv-neuron" / "bin" / "python"), "env": env,
            "commit": commit, "stack": stack}


def make(rehearsal, target: str, *variables: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", target, *variables], cwd=rehearsal["project"],
                          env=rehearsal["env"], capture_output=True, text=True, timeout=900)


def install(rehearsal) -> subprocess.CompletedProcess:
    """The README's install command; its venv from this machine's Python (the trn2's is 3.12)."""
    return make(rehearsal, "install-neuron", f"NEURON_PYTHON={BASE_PYTHON}")


# The interpreter this venv was made from.
BASE_PYTHON = str(Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}")


def test_the_install_and_the_lock_succeed_against_the_2_33_0_stand_ins_and_the_record_names_every_component(
        rehearsal):
    project, python = rehearsal["project"], rehearsal["python"]
    result = install(rehearsal)
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-4000:]
    # Every step ran, in AWS's order, and the last one printed the installed stack.
    steps = re.findall(r"^\[(\d+)/(\d+)\] (.*)$", result.stdout, re.MULTILINE)
    assert [int(n) for n, _, _ in steps] == list(range(1, int(steps[0][1]) + 1)), steps
    assert [what for _, _, what in steps][:2] == ["the Neuron SDK 2.33.0 packages and the pinned Python packages",
                                                  "TorchTitan Neuron: clone"]

    # What pin_env records, read in the installed venv: every component of the release, the fork at its commit.
    code = ("import json; from qwen3_pilot import neuron_stack as s; "
            "print(json.dumps(s.installed_record(s.read_stack())))")
    recorded = subprocess.run([python, "-c", code], cwd=project, env=rehearsal["env"], capture_output=True,
                              text=True)
    assert recorded.returncode == 0, recorded.stderr[-3000:]
    record = json.loads(recorded.stdout)
    rows = {row["component"]: row for row in record["components"]}
    stack = rehearsal["stack"]
    assert set(rows) == set(stack.python) | set(stack.system) | {"torchtitan"}
    for name in stack.python:
        assert rows[name]["ok"] and rows[name]["installed"] == AWS_2_33_0[name], rows[name]
    assert record["fork_commit"] == rehearsal["commit"]
    assert rows["torchtitan"]["ok"] and rows["torchtitan"]["installed"] == f"0.2.2+neuron.1 @ {rehearsal['commit']}"
    for name in stack.system:  # OS packages: this machine has none of them, and the record says so
        assert not rows[name]["ok"] and rows[name]["installed"] == "not found", rows[name]
    # The editable install imports from the clone at the fork's commit.
    where = subprocess.run([python, "-c", "import torchtitan_neuron; print(torchtitan_neuron.__file__)"],
                           cwd=project, capture_output=True, text=True)
    assert where.stdout.strip() == str(project / FORK_CLONE / "torchtitan_neuron" / "__init__.py"), where.stderr

    # The documented lock command, against the same stand-ins; with this venv's interpreter, whose pip-tools is
    # real (the installed venv has the pip-tools stand-in), on the copy's code.
    lock = make(rehearsal, "lock-neuron", f"NEURON_PY={sys.executable}")
    assert lock.returncode == 0, (lock.stdout + lock.stderr)[-4000:]
    locked = (project / "envs" / "neuron.lock").read_text()
    for name, version in {**{n: AWS_2_33_0[n] for n in stack.python}, "torch": "2.14.0"}.items():
        assert re.search(rf"^{name}=={re.escape(version)} \\\n\s+--hash=sha256:", locked, re.MULTILINE), name


# Each install defect of envs/neuron.txt before issue 19, alone in today's file: the rehearsal fails on it.
DEFECTS = {
    "nki_of_sdk_2_32": ("nki==0.7.0", "nki==0.6.*", "nki==0.6.*"),
    "fork_from_an_index": ("nki==0.7.0", "nki==0.7.0\ntorchtitan==0.2.2+neuron.1", "torchtitan==0.2.2+neuron.1"),
}


@pytest.mark.parametrize("defect", DEFECTS)
def test_each_defect_of_envs_neuron_txt_before_issue_19_fails_the_same_rehearsal(rehearsal, defect):
    line, replacement, unserved = DEFECTS[defect]
    pins = rehearsal["project"] / "envs" / "neuron.txt"
    assert line in pins.read_text()
    pins.write_text(pins.read_text().replace(line, replacement))
    result = install(rehearsal)
    assert result.returncode != 0
    text = result.stdout + result.stderr
    assert "step 1 (the Neuron SDK 2.33.0 packages and the pinned Python packages) failed" in text, text[-3000:]
    assert f"No matching distribution found for {unserved}" in text, text[-3000:]
    assert not (rehearsal["project"] / FORK_CLONE).exists()
