"""The trn2 install rehearsed on this machine: `make install-neuron` (qwen3_pilot.backends.neuron.stack install), `make
lock-neuron`, the install again from the lock, and pin_env's check of the installed venv against the lock, on
two machine layouts: plain Ubuntu 26.04 (the standalone wheels) and the release's DLAMI (AWS's venv, holding the
release's pip components, that .venv-neuron is built on); and the refusals of another OS and another Python.

What stands in for what: a file system root in a test folder (its etc/os-release, the DLAMI's venv under its
opt/); a local package folder with stand-ins of exactly the names and versions of the release file and of
workflow/envs/neuron.txt, beside the real wheels of pip-tools and what it needs (the lock is made with them); and a
local git repository for the TorchTitan Neuron fork (git's url.<base>.insteadOf sends the release file's URL there).
pip is kept off every index (PIP_NO_INDEX) and reads only that folder (PIP_FIND_LINKS), so the real commands and
the real workflow/envs/ files run, and nothing reaches the network. This machine's Python is 3.11, which no release
supports: the copy's release file admits it (the one edit to the copy, asserted), and the refusal of an
unsupported Python is tested with the file as committed.
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

from qwen3_pilot.backends.neuron.stack import FORK_CLONE, read_release
from qwen3_pilot.pins import installed_version, lock_drift, read_lock, read_pins

# AWS's SDK 2.33.0 pip components as its release notes list them (workflow/resources/neuron/sdk-2.33.0-components.md),
# with the torch its torch-neuronx is built for: what AWS's repository and PyTorch's CPU index would serve.
AWS_2_33_0 = {"torch": "2.14.0", "torch-neuronx": "2.14.3.0", "neuronx-cc": "2.28.7631.0", "nki": "0.7.0"}
# pip-tools and what it installs with it, as real wheels of this venv's own (the lock is made with them, and a
# lock of a real pip-tools holds pip and setuptools, as the instance's will).
# A dependency only the fork's pyproject.toml declares (no requirements file names it): the lock must hold it.
FORK_DEPENDENCY, FORK_DEPENDENCY_VERSION = "fork-only-dependency", "1.0"
REAL = ("pip-tools", "build", "click", "pyproject-hooks", "pip", "setuptools", "wheel", "packaging")


def record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def write_wheel(folder: Path, name: str, version: str, files: dict[str, bytes] | None = None) -> Path:
    """A wheel of `name` `version` holding `files` (default: one empty module), with its METADATA, WHEEL and
    RECORD: what pip needs to install it."""
    normal = re.sub(r"[-_.]+", "_", name).lower()
    files = dict(files or {f"{normal}_stand_in.py": b""})
    dist_info = f"{normal}-{version}.dist-info"
    files.setdefault(f"{dist_info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode())
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
    for extra in ("METADATA", "entry_points.txt", "top_level.txt"):  # METADATA: its requirements too
        text = distribution.read_text(extra)
        if text:
            normal = re.sub(r"[-_.]+", "_", name).lower()  # write_wheel's dist-info name
            files[f"{normal}-{distribution.version}.dist-info/{extra}"] = text.encode()
    return write_wheel(folder, name, distribution.version, files)


# A build backend in the stand-in fork's own tree (PEP 517 backend-path): its editable build needs nothing
# from an index. The editable wheel is a .pth file naming the tree, as setuptools' simplest mode makes it.
FORK_BACKEND = '''
import base64, hashlib, os, zipfile

NAME, VERSION, DEPENDENCY = "torchtitan", "{version}", "{dependency}"
DIST_INFO = f"{{NAME}}-{{VERSION}}.dist-info"


def _line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{{path}},sha256={{digest}},{{len(data)}}"


def get_requires_for_build_editable(config_settings=None):
    return []


def get_requires_for_build_wheel(config_settings=None):
    return []


# pip-compile reads the fork's pyproject.toml for its own dependencies through this hook.
def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    os.makedirs(os.path.join(metadata_directory, DIST_INFO))
    with open(os.path.join(metadata_directory, DIST_INFO, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\\nName: {{NAME}}\\nVersion: {{VERSION}}\\nRequires-Dist: {{DEPENDENCY}}\\n")
    return DIST_INFO


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    files = {{
        "torchtitan_stand_in.pth": (os.path.abspath(".") + "\\n").encode(),
        f"{{DIST_INFO}}/METADATA": (f"Metadata-Version: 2.1\\nName: {{NAME}}\\nVersion: {{VERSION}}\\n"
                                    f"Requires-Dist: {{DEPENDENCY}}\\n").encode(),
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
    (root / "requirements.txt").write_text("torch\nsafetensors\n")  # pinned by workflow/envs/neuron.txt as constraints
    (root / "stand_in_backend.py").write_text(FORK_BACKEND.format(version=version, dependency=FORK_DEPENDENCY))
    (root / "pyproject.toml").write_text('[build-system]\nrequires = []\nbuild-backend = "stand_in_backend"\n'
                                         'backend-path = ["."]\n')  # its own dependency: FORK_DEPENDENCY
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    for command in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "stand-in"]):
        subprocess.run([*git, *command], check=True, capture_output=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    return root, commit


def stand_in_index(folder: Path) -> Path:
    """Every distribution the install asks for: stand-ins at the versions workflow/envs/neuron.txt pins and AWS's 2.33.0
    list names (none of them real), and real wheels of pip-tools and its requirements and of setuptools."""
    folder.mkdir()
    for name, pin in read_pins(PROJECT / "workflow" / "envs" / "neuron.txt").items():
        if name not in REAL:
            write_wheel(folder, name, pin.specifier.removeprefix("=="))
    for name, version in AWS_2_33_0.items():
        write_wheel(folder, name, version)
    for name in REAL:
        wheel_of_installed(folder, name)
    write_wheel(folder, FORK_DEPENDENCY, FORK_DEPENDENCY_VERSION)
    return folder


# This machine's Python, which the copy's release file admits (no release supports 3.11).
BASE_PYTHON = str(Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}")
THIS_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
UBUNTU = {"26.04": 'PRETTY_NAME="Ubuntu 26.04 LTS"\nID=ubuntu\nVERSION_ID="26.04"\n',
          "24.04": 'PRETTY_NAME="Ubuntu 24.04.3 LTS"\nID=ubuntu\nVERSION_ID="24.04"\n'}


@pytest.fixture
def rehearsal(tmp_path):
    """A copy of the project (its workflow/envs/ as committed, the release file admitting this Python), the stand-in
    index and fork, a file system root, and the environment that keeps pip and git on them."""
    project = tmp_path / "project"
    shutil.copytree(PROJECT, project, ignore=shutil.ignore_patterns(
        ".venv", ".venv-neuron", ".git", "results", "logs", ".snakemake", ".cache", "vendor", "__pycache__",
        "*.egg-info"))
    release = project / "workflow" / "envs" / "neuron-sdk" / "2.33.0.toml"
    text = release.read_text()
    assert 'python = ["3.12", "3.13", "3.14"]' in text
    release.write_text(text.replace('python = ["3.12",', f'python = ["{THIS_PYTHON}", "3.12",'))
    stack = read_release("2.33.0", project)
    fork, commit = make_fork(tmp_path / "fork", stack.fork.version)
    subprocess.run(["git", "-C", str(fork), "branch", stack.fork.ref], check=True)  # the release's branch
    index = stand_in_index(tmp_path / "index")
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    env = {**venv_env(), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index), "PIP_NO_CACHE_DIR": "1",
           # git fetches the release file's URL from the stand-in repository instead.
           "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": f"url.{fork.as_uri()}.insteadOf",
           "GIT_CONFIG_VALUE_0": stack.fork.url}
    return {"project": project, "python": str(project / ".venv-neuron" / "bin" / "python"), "env": env,
            "commit": commit, "stack": stack, "root": root}


def make(rehearsal, target: str, *variables: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", target, *variables], cwd=rehearsal["project"],
                          env=rehearsal["env"], capture_output=True, text=True, timeout=900)


def install(rehearsal, os_version: str, python: str = BASE_PYTHON) -> subprocess.CompletedProcess:
    """The README's install command on a machine running Ubuntu `os_version`."""
    (rehearsal["root"] / "etc" / "os-release").write_text(UBUNTU[os_version])
    return make(rehearsal, "install-neuron", f"NEURON_PYTHON={python}", f"ARGS=--root {rehearsal['root']}")


def make_dlami_venv(rehearsal) -> Path:
    """AWS's venv as the DLAMI ships it: the release's pip components (stand-ins) in a venv at its path."""
    venv = rehearsal["root"] / rehearsal["stack"].machine.dlami_venv.lstrip("/")
    subprocess.run([BASE_PYTHON, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    *(f"{name}=={version}" for name, version in AWS_2_33_0.items())],
                   env=rehearsal["env"], check=True, capture_output=True)
    return venv


def venv_distributions(python: str) -> dict[str, str]:
    """Every distribution the venv's interpreter imports from, {canonical name: version}, as pin_env reads them."""
    code = ("import json; from importlib import metadata; from packaging.utils import canonicalize_name as c; "
            "d = {}\nfor x in metadata.distributions(): d.setdefault(c(x.metadata['Name']), x.version)\n"
            "print(json.dumps(d))")
    result = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


def installed_record(rehearsal) -> dict:
    code = ("import json; from qwen3_pilot.backends.neuron.stack import read_release, installed; "
            "print(json.dumps(installed.installed_record(read_release('2.33.0'))))")
    recorded = subprocess.run([rehearsal["python"], "-c", code], cwd=rehearsal["project"], env=rehearsal["env"],
                              capture_output=True, text=True)
    assert recorded.returncode == 0, recorded.stderr[-3000:]
    return json.loads(recorded.stdout)


def assert_installed_as_the_release(rehearsal, result):
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-4000:]
    # Every step ran in order, and the last one printed the installed stack.
    steps = re.findall(r"^\[(\d+)/(\d+)\] (.*)$", result.stdout, re.MULTILINE)
    assert [int(n) for n, _, _ in steps] == list(range(1, int(steps[0][1]) + 1)), steps
    record = installed_record(rehearsal)
    rows = {row["component"]: row for row in record["components"]}
    stack = rehearsal["stack"]
    assert set(rows) == set(stack.pip_packages) | set(stack.os_packages) | {"torchtitan"}
    for name in stack.pip_packages:
        assert rows[name]["ok"] and rows[name]["installed"] == AWS_2_33_0[name], rows[name]
    assert record["fork_commit"] == rehearsal["commit"]
    assert rows["torchtitan"]["ok"] and rows["torchtitan"]["installed"] == f"0.2.2+neuron.1 @ {rehearsal['commit']}"
    for name in stack.os_packages:  # OS packages: this machine has none of them, and the record says so
        assert not rows[name]["ok"] and rows[name]["installed"] == "not found", rows[name]
    # The editable install imports from the clone at the fork's commit.
    project = rehearsal["project"]
    where = subprocess.run([rehearsal["python"], "-c", "import torchtitan_neuron; print(torchtitan_neuron.__file__)"],
                           cwd=project, capture_output=True, text=True)
    assert where.stdout.strip() == str(project / FORK_CLONE / "torchtitan_neuron" / "__init__.py"), where.stderr
    return steps


def test_on_ubuntu_26_04_install_then_lock_then_install_from_the_lock_passes_pin_envs_lock_check(rehearsal):
    project = rehearsal["project"]
    steps = assert_installed_as_the_release(rehearsal, install(rehearsal, "26.04"))
    assert [what for _, _, what in steps][1:4] == [
        "the Neuron SDK 2.33.0 pip components as a requirements file",
        "the Neuron SDK 2.33.0 packages and the pinned Python packages", "TorchTitan Neuron: clone"]
    assert steps[0][2].endswith("(ubuntu 26.04, standalone)")

    # The documented lock command, in the venv the install made (its pip-tools is real).
    lock = make(rehearsal, "lock-neuron")
    assert lock.returncode == 0, (lock.stdout + lock.stderr)[-4000:]
    lock_file = project / "workflow" / "envs" / "neuron-sdk" / "2.33.0.lock"
    locked = read_lock(lock_file)
    assert {name: locked[name] for name in AWS_2_33_0} == AWS_2_33_0
    assert locked[FORK_DEPENDENCY] == FORK_DEPENDENCY_VERSION  # from the fork's pyproject.toml only
    assert locked["pip"] == installed_version("pip")  # pip-tools' requirement, as on the instance
    assert "torchtitan" not in locked  # the fork is checked by its commit, not by the lock

    # The install again, now from the lock (hashes checked), and pin_env's lock check on the venv it leaves.
    again = install(rehearsal, "26.04")
    assert "--require-hashes -r " + str(lock_file) in again.stdout
    assert_installed_as_the_release(rehearsal, again)
    installed = venv_distributions(rehearsal["python"])
    assert lock_drift(locked, installed, unlocked=("torchtitan",)) == []
    assert lock_drift(locked, installed) == [{"package": "torchtitan", "locked": "not locked",
                                              "installed": "0.2.2+neuron.1"}]


def test_on_the_dlami_the_venv_is_built_on_awss_venv_and_takes_its_neuron_packages_as_shipped(rehearsal):
    dlami = make_dlami_venv(rehearsal)
    result = install(rehearsal, "24.04")
    steps = assert_installed_as_the_release(rehearsal, result)
    assert steps[0][2].endswith("(ubuntu 24.04, dlami)") and str(dlami / "bin" / "python") in steps[0][2]
    assert steps[1][2].startswith(f"on AWS's venv {dlami}")
    # AWS's packages are imported from AWS's venv: none was installed into .venv-neuron.
    site = next((rehearsal["project"] / ".venv-neuron" / "lib").glob("python3.*/site-packages"))
    for name in ("torch_neuronx", "neuronx_cc", "nki"):
        assert not list(site.glob(f"{name}-*.dist-info")), name
        assert list(next((dlami / "lib").glob("python3.*/site-packages")).glob(f"{name}-*.dist-info")), name


def test_another_os_and_an_unsupported_python_are_refused_before_anything_is_made(rehearsal):
    result = install(rehearsal, "24.04")  # Ubuntu 24.04 without the DLAMI's venv
    assert result.returncode != 0
    assert "install-neuron: this machine runs ubuntu 24.04: SDK 2.33.0's standalone wheels are built for ubuntu " \
           "26.04 only" in result.stderr, result.stderr
    (rehearsal["root"] / "etc" / "os-release").write_text('ID=debian\nVERSION_ID="12"\n')
    result = make(rehearsal, "install-neuron", f"NEURON_PYTHON={BASE_PYTHON}", f"ARGS=--root {rehearsal['root']}")
    assert "this machine runs debian 12" in result.stderr
    # The release file as committed: this machine's Python is none of the supported ones.
    release = rehearsal["project"] / "workflow" / "envs" / "neuron-sdk" / "2.33.0.toml"
    release.write_text((PROJECT / "workflow" / "envs" / "neuron-sdk" / "2.33.0.toml").read_text())
    result = install(rehearsal, "26.04")
    assert result.returncode != 0
    assert f"{BASE_PYTHON} is Python {THIS_PYTHON}; SDK 2.33.0 supports Python 3.12, 3.13, 3.14" in result.stderr
    assert not (rehearsal["project"] / ".venv-neuron").exists()
