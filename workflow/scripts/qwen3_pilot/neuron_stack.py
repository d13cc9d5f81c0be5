"""The Neuron software stack as AWS ships it for one SDK release (workflow/envs/neuron-sdk/<release>.toml, picked by
config neuron.sdk): the pins the stages depend on, its install on a trn2, and what pin_env and the preflight
check against it.

AWS ships the stack in three ways at once: torch-neuronx, neuronx-cc and nki from AWS's own pip repository
(with PyTorch's CPU index for torch), the driver, runtime, collectives and tools as OS packages, and
TorchTitan Neuron only as a git repository installed editable from a clone. On its DLAMI a release's pip
components come preinstalled in AWS's venv. `install_steps` follows AWS's documented order;
`python -m qwen3_pilot.neuron_stack --sdk R install` (make install-neuron) runs it.

Standard library only: the install runs with the machine's own python3, before any venv exists.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from .paths import PROJECT

SDK_FOLDER = "workflow/envs/neuron-sdk"  # one <release>.toml per SDK release; config key neuron.sdk picks one
PINS_FILE = "workflow/envs/neuron.txt"  # the neuron backend's other packages; the release's own come from its file
# Where the install clones the fork (ignored by git): its editable install imports from here.
FORK_CLONE = "vendor/torchtitan-neuron"
COMMIT = re.compile(r"[0-9a-f]{40}")
VERSION = re.compile(r"\d+(\.\d+)*(\.\*)?")
# A value no AWS page read for this project states (a release file's version, its machine): never taken as
# equal to anything, so it reruns what uses it and fails pin_env until someone writes the version AWS names.
UNRECORDED = "unrecorded"
NOT_INSTALLED = "not installed"  # pins.NOT_INSTALLED, spelled here: this module imports only the stdlib
OS_PACKAGE = "os package"


class StackError(ValueError):
    pass


@dataclass(frozen=True)
class Fork:
    url: str
    ref: str
    version: str
    distribution: str

    @property
    def pinned(self) -> bool:
        """A 40-hex commit names one tree; a branch or tag may move."""
        return bool(COMMIT.fullmatch(self.ref))

    @property
    def source(self) -> str:
        return f"{self.url} @ {self.ref}"


@dataclass(frozen=True)
class Machine:
    """Where a release runs, as AWS documents it; None where unrecorded."""

    python: tuple[str, ...] | None  # supported Python versions ("3.12")
    standalone_os: tuple[str, ...] | None  # OSes AWS builds the standalone wheels for ("ubuntu 26.04")
    dlami: str | None  # the Deep Learning AMI that carries the release
    dlami_os: tuple[str, ...] | None
    dlami_venv: str | None  # AWS's venv on that DLAMI, with the release's pip components
    dlami_ssm_path: str | None


@dataclass(frozen=True)
class NeuronStack:
    path: str
    release: str
    released: str
    sources: tuple[str, ...]
    machine: Machine
    extra_indexes: tuple[str, ...]
    framework: dict[str, str]  # the torch the release's torch-neuronx is built for (PyTorch's, not AWS's)
    python: dict[str, str]  # AWS's pip component -> the release's version (may end in .*, or be UNRECORDED)
    system: dict[str, str]  # OS package every device stage runs on -> the release's version
    tools: dict[str, str]  # OS package only the rank check reads (neuron-ls) -> the release's version
    fork: Fork

    @property
    def pip_packages(self) -> dict[str, str]:
        return {**self.framework, **self.python}

    @property
    def os_packages(self) -> dict[str, str]:
        return {**self.system, **self.tools}

    @property
    def lock_file(self) -> str:
        """The release's hash lock, made on an instance by `make lock-neuron` (a lock holds one release's wheels)."""
        return f"{SDK_FOLDER}/{self.release}.lock"

    def components(self) -> dict[str, str]:
        """Every component with the release's version: pip, OS packages, and the fork (its version @ its ref)."""
        fork = {self.fork.distribution: f"{self.fork.version} @ {self.fork.ref}"}
        return {**self.pip_packages, **self.os_packages, **fork}

    def index_options(self) -> list[str]:
        return [option for url in self.extra_indexes for option in ("--extra-index-url", url)]

    def requirements(self) -> str:
        """The release's pip components as a requirements file (what the install and the lock read beside
        workflow/envs/neuron.txt); an unrecorded version is left to the resolver (torch-neuronx's own requirements)."""
        return "".join(f"{name}=={version}\n" if version != UNRECORDED else f"{name}\n"
                       for name, version in self.pip_packages.items())


def stack_path(release: str, project: Path = PROJECT) -> Path:
    return project / SDK_FOLDER / f"{release}.toml"


def known_releases(project: Path = PROJECT) -> list[str]:
    def key(release: str) -> tuple[int, ...]:
        return tuple(int(part) for part in release.split(".") if part.isdigit())

    return sorted((path.stem for path in (project / SDK_FOLDER).glob("*.toml")), key=key)


def read_releases(project: Path = PROJECT) -> list[NeuronStack]:
    """Every release recorded in workflow/envs/neuron-sdk/, oldest first."""
    return [read_release(release, project) for release in known_releases(project)]


def read_release(release: str, project: Path = PROJECT) -> NeuronStack:
    """The stack file of `release` (config neuron.sdk); StackError names the known releases when there is none."""
    path = stack_path(release, project)
    if not path.is_file():
        raise StackError(f"neuron.sdk = {release!r}: there is no {SDK_FOLDER}/{release}.toml; known releases: "
                         f"{', '.join(known_releases(project)) or 'none'}")
    return read_stack(path)


def read_stack(path: Path | str) -> NeuronStack:
    """One release's stack file, every key it must have checked; StackError names the file and the key."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise StackError(f"{path}: cannot read the Neuron stack file: {error}") from None

    def table(name: str) -> dict[str, Any]:
        value = data.get(name)
        if not isinstance(value, dict) or not value:
            raise StackError(f"{path}: [{name}] is missing or empty")
        return value

    def text(section: str, key: str) -> str:
        value = table(section).get(key)
        if not isinstance(value, str) or not value.strip():
            raise StackError(f"{path}: [{section}] {key} must be a non-empty string, got {value!r}")
        return value

    def recorded(section: str, key: str, many: bool = False) -> Any:
        value = table(section).get(key)
        if value == UNRECORDED:
            return None
        if many and isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
            return tuple(value)
        if not many and isinstance(value, str) and value:
            return value
        raise StackError(f"{path}: [{section}] {key} must be {'a list of strings' if many else 'a string'} or "
                         f"{UNRECORDED!r}, got {value!r}")

    release, released = text("sdk", "release"), text("sdk", "released")
    if Path(path).stem != release:
        raise StackError(f"{path}: [sdk] release = {release!r}; the file of a release is named after it")
    sources = table("sdk").get("sources")
    indexes = table("indexes").get("extra")
    for key, urls in (("[sdk] sources", sources), ("[indexes] extra", indexes)):
        if not isinstance(urls, list) or not urls or not all(isinstance(u, str) and u.startswith("https://")
                                                               for u in urls):
            raise StackError(f"{path}: {key} must be a list of https:// URLs, got {urls!r}")
    versions = {}
    for section in ("framework", "python", "system", "tools"):
        for name, version in table(section).items():
            if not isinstance(version, str) or not (version == UNRECORDED or VERSION.fullmatch(version)):
                raise StackError(f"{path}: [{section}] {name} = {version!r} is not a version like 2.28.7631.0 "
                                 f"or {UNRECORDED!r}")
        versions[section] = dict(table(section))
    fork_version = text("fork", "version")
    if fork_version != UNRECORDED and not re.fullmatch(r"\d[\w.+-]*", fork_version):
        raise StackError(f"{path}: [fork] version = {fork_version!r} is not a version or {UNRECORDED!r}")
    machine = Machine(python=recorded("machine", "python", many=True),
                      standalone_os=recorded("machine", "standalone_os", many=True),
                      dlami=recorded("machine", "dlami"), dlami_os=recorded("machine", "dlami_os", many=True),
                      dlami_venv=recorded("machine", "dlami_venv"),
                      dlami_ssm_path=recorded("machine", "dlami_ssm_path"))
    return NeuronStack(
        path=str(path), release=release, released=released, sources=tuple(sources), machine=machine,
        extra_indexes=tuple(indexes), framework=versions["framework"], python=versions["python"],
        system=versions["system"], tools=versions["tools"],
        fork=Fork(url=text("fork", "url"), ref=text("fork", "ref"), version=fork_version,
                  distribution=text("fork", "distribution")),
    )


def component_changes(old: NeuronStack, new: NeuronStack) -> list[dict[str, str]]:
    """Each component whose version differs between two releases (an unrecorded one always differs), in the
    order of the new release's file; the fork by its version and ref."""
    before, after = old.components(), new.components()
    return [{"component": name, "from": before.get(name, "absent"), "to": version}
            for name, version in after.items()
            if before.get(name) != version or UNRECORDED in version]


def release_admits(release_version: str, installed: str) -> bool:
    """The release's version (2.28.7631.0, or a family 2.14.3.0.*) against an installed one; a local label
    (+abc) and a Debian revision (-1) are not part of the release's number. An unrecorded version admits
    nothing."""
    if release_version == UNRECORDED:
        return False
    number = re.split(r"[+-]", installed, maxsplit=1)[0]
    if release_version.endswith(".*"):
        return (number + ".").startswith(release_version[:-1])
    return number == release_version


def pin_problems(stack: NeuronStack, pins: dict[str, Any]) -> list[str]:
    """workflow/envs/neuron.txt against the stack: it pins none of the release's own components (the release file does,
    so that switching the release is one line) and not the fork (no index serves it; the release file's [fork]
    installs it). `pins` are pins.read_pins' {name: Pin}."""
    problems = [f"{PINS_FILE} pins {name}{pins[name].specifier}, a component of the Neuron SDK release: its "
                f"version comes from {SDK_FOLDER}/<release>.toml (SDK {stack.release}: {version})"
                for name, version in stack.pip_packages.items() if name in pins]
    if stack.fork.distribution in pins:
        problems.append(f"{PINS_FILE} pins {stack.fork.distribution}, which no index serves: TorchTitan Neuron is "
                        f"installed from {stack.fork.url} ({stack.path} [fork])")
    return problems


def components_problems(stack: NeuronStack, published: str) -> list[str]:
    """The stack's versions against AWS's published component list as recorded in
    workflow/resources/neuron/sdk-<release>-components.md (its table rows: | component | version | how |).
    An unrecorded version is not compared (nothing to compare); the list says what was read."""
    problems = []
    table = published.lower()
    title = published.splitlines()[0] if published.strip() else ""
    if f"SDK {stack.release} " not in f"{title} ":
        problems.append(f"the published list is not SDK {stack.release}'s (its title: {title!r})")
    for name, version in {**stack.python, **stack.os_packages, stack.fork.distribution: stack.fork.version}.items():
        shown = version.removesuffix(".*")
        if version != UNRECORDED and not re.search(rf"\|[^|\n]*\|\s*{re.escape(shown)}[\s|(]", table):
            problems.append(f"{name} {version}: no row of the published list has version {shown}")
    return problems


# ---- the machine ----


def os_name(os_release: str) -> str:
    """`ubuntu 26.04` from /etc/os-release's ID and VERSION_ID."""
    fields = {key: value.strip('"') for key, value in
              (line.split("=", 1) for line in os_release.splitlines() if "=" in line)}
    return f"{fields.get('ID', '?')} {fields.get('VERSION_ID', '?')}"


@dataclass(frozen=True)
class Layout:
    """How the install builds .venv-neuron on this machine: on the DLAMI's venv (AWS's pip components as
    shipped) or from the standalone wheels."""

    kind: str  # "dlami" | "standalone"
    os: str
    base_python: str  # the interpreter the venv is made from
    dlami_venv: Path | None = None


def machine_layout(stack: NeuronStack, root: Path, python: str,
                   python_version: Callable[[str], str] | None = None) -> Layout:
    """The layout this machine allows for the release, or StackError naming the OS or Python found, the
    supported ones, and AWS's pages. `root` is the file system's root (a test's folder in the rehearsal)."""
    python_version = python_version or _python_version
    machine, where = stack.machine, f"{stack.path} [machine]"
    os_release = root / "etc" / "os-release"
    found = os_name(os_release.read_text()) if os_release.is_file() else f"unknown (no {os_release})"
    dlami_venv = root / machine.dlami_venv.lstrip("/") if machine.dlami_venv else None
    if dlami_venv is not None and (dlami_venv / "bin" / "python").exists() and found in (machine.dlami_os or ()):
        layout = Layout("dlami", found, str(dlami_venv / "bin" / "python"), dlami_venv)
    elif machine.standalone_os is None:
        raise StackError(f"SDK {stack.release}'s supported OS is unrecorded in {where}, and no DLAMI venv of it "
                         f"was found: read AWS's pages for it ({', '.join(stack.sources)}) and record it")
    elif found in machine.standalone_os:
        layout = Layout("standalone", found, python)
    else:
        dlami = (f"its DLAMI \"{machine.dlami}\" ({', '.join(machine.dlami_os or ())}) with AWS's venv "
                 f"{machine.dlami_venv}, which is not on this machine" if machine.dlami else "its DLAMI unrecorded")
        raise StackError(f"this machine runs {found}: SDK {stack.release}'s standalone wheels are built for "
                         f"{', '.join(machine.standalone_os)} only, and {dlami}. Launch that DLAMI or a supported "
                         f"OS ({where}; AWS: {', '.join(stack.sources)})")
    have = python_version(layout.base_python)
    if machine.python is None or have not in machine.python:
        supported = ", ".join(machine.python) if machine.python else "unrecorded"
        raise StackError(f"{layout.base_python} is Python {have}; SDK {stack.release} supports Python {supported} "
                         f"({where}): give another with NEURON_PYTHON=...")
    return layout


def _python_version(python: str) -> str:
    return subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], check=True,
                          capture_output=True, text=True).stdout.strip()


def layer_on(venv: Path, base: Path) -> Path:
    """Makes `venv` import AWS's venv `base` after its own packages (a .pth file naming base's site-packages):
    AWS's torch-neuronx, compiler and NKI as shipped, this project's other packages in `venv`."""
    (site,) = sorted((venv / "lib").glob("python3.*/site-packages"))
    bases = sorted((base / "lib").glob("python3.*/site-packages"))
    if [path.parent.name for path in bases] != [site.parent.name]:
        raise StackError(f"{base} holds no site-packages for {site.parent.name}: it is not the venv of this "
                         f"interpreter's Python")
    pth = site / "aws-neuron-dlami-venv.pth"
    pth.write_text(f"{bases[0]}\n")
    return pth


# ---- the install ----


@dataclass(frozen=True)
class Step:
    what: str
    command: list[str] = field(default_factory=list)
    # Run only when this path does not exist yet (the clone: a rerun fetches into the existing one).
    unless_exists: Path | None = None
    # A step the install does itself instead of a command (its description printed as the command).
    action: Callable[[], object] | None = None


def release_requirements(stack: NeuronStack, venv: Path) -> Path:
    return venv / f"neuron-sdk-{stack.release}.txt"


def install_steps(stack: NeuronStack, layout: Layout, venv: Path, project: Path = PROJECT) -> list[Step]:
    """AWS's order: the venv (on the DLAMI: on AWS's venv); the release's pip components with the rest of
    workflow/envs/neuron.txt (or the release's hash lock, once made on an instance) from AWS's repository and PyTorch's
    CPU index beside PyPI; the fork cloned and checked out at its ref, its requirements.txt and itself
    installed editable, neither allowed to move a pin; then this project, without dependencies; pip's
    consistency check; and the installed stack against the release."""
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check"]
    indexes = stack.index_options()
    lock, pins, requirements = project / stack.lock_file, project / PINS_FILE, release_requirements(stack, venv)
    clone = project / FORK_CLONE
    packages = ["--require-hashes", "-r", str(lock)] if lock.exists() else ["-r", str(requirements), "-r", str(pins)]
    constrained = ["-c", str(requirements), "-c", str(pins), *indexes]
    steps = [Step(f"the venv {venv} from {layout.base_python} ({layout.os}, {layout.kind})",
                  [layout.base_python, "-m", "venv", str(venv)], unless_exists=venv / "bin" / "python")]
    if layout.dlami_venv is not None:
        steps.append(Step(f"on AWS's venv {layout.dlami_venv}: its packages imported after the venv's own",
                          ["write", f"{venv}/lib/python3.*/site-packages/aws-neuron-dlami-venv.pth"],
                          action=lambda: layer_on(venv, layout.dlami_venv)))
    steps += [
        Step(f"the Neuron SDK {stack.release} pip components as a requirements file", ["write", str(requirements)],
             action=lambda: requirements.write_text(stack.requirements())),
        Step(f"the Neuron SDK {stack.release} packages and the pinned Python packages", [*pip, *packages, *indexes]),
        Step("TorchTitan Neuron: clone", ["git", "clone", "--no-checkout", stack.fork.url, str(clone)],
             unless_exists=clone),
        Step(f"TorchTitan Neuron: fetch {stack.fork.ref}",
             ["git", "-C", str(clone), "fetch", "origin", stack.fork.ref]),
        Step(f"TorchTitan Neuron: check out {stack.fork.ref}",
             ["git", "-C", str(clone), "checkout", "--detach", "FETCH_HEAD"]),
        Step("TorchTitan Neuron: its requirements.txt", [*pip, "-r", str(clone / "requirements.txt"), *constrained]),
        Step("TorchTitan Neuron: editable install", [*pip, "-e", str(clone), *constrained]),
        Step("this project", [*pip, "--no-deps", "-e", str(project)]),
        Step("consistency", [python, "-m", "pip", "check"]),
        # In the venv just made: what pin_env will record, every component against the release.
        Step(f"the installed stack against SDK {stack.release}",
             [python, "-m", "qwen3_pilot.neuron_stack", "--sdk", stack.release, "record"]),
    ]
    return steps


def lock_command(stack: NeuronStack, python: str, venv: Path, project: Path = PROJECT) -> list[str]:
    """The release's hash lock from its pip components, workflow/envs/neuron.txt and the cloned fork's requirements.txt
    and pyproject.toml (its own dependencies): every package pinned with the sha256 of each of its files on the
    indexes (pip-tools, as workflow/envs/cpu.lock); run on the instance after the install, and commit the lock: the
    next install takes it (install_steps)."""
    fork = [str(project / FORK_CLONE / name) for name in ("requirements.txt", "pyproject.toml")
            if (project / FORK_CLONE / name).is_file()]
    return [python, "-m", "piptools", "compile", "--quiet", "--allow-unsafe", "--generate-hashes",
            "--no-emit-index-url", "--no-emit-find-links", "--strip-extras", *stack.index_options(),
            "--output-file", str(project / stack.lock_file), str(release_requirements(stack, venv)),
            str(project / PINS_FILE), *fork]


def run_install(steps: list[Step], run: Callable[[list[str]], int] | None = None,
                echo: Callable[[str], None] = print) -> int:
    """Runs the steps, each printed before it runs; stops at the first that fails, naming it."""
    run = run or (lambda command: subprocess.run(command).returncode)
    for number, step in enumerate(steps, start=1):
        if step.unless_exists is not None and step.unless_exists.exists():
            echo(f"[{number}/{len(steps)}] {step.what}: {step.unless_exists} exists, kept")
            continue
        echo(f"[{number}/{len(steps)}] {step.what}\n  $ {shlex.join(step.command)}")
        sys.stdout.flush()  # before the command's own output
        try:
            if step.action is not None:
                step.action()
            code = 0 if step.action is not None else run(step.command)
        except (OSError, StackError) as error:
            echo(f"install-neuron: step {number} ({step.what}) failed: {error}")
            return 1
        if code != 0:
            echo(f"install-neuron: step {number} ({step.what}) failed with exit code {code}")
            return code
    return 0


# ---- what is installed ----


def editable_source(distribution: str, read_text: Callable[[str, str], str | None] | None = None) -> Path | None:
    """The folder an editable install of `distribution` imports from (PEP 610's direct_url.json), or None."""
    read_text = read_text or _distribution_file
    raw = read_text(distribution, "direct_url.json")
    if not raw:
        return None
    record = json.loads(raw)
    if not record.get("dir_info", {}).get("editable") or not record.get("url", "").startswith("file://"):
        return None
    return Path(unquote(urlparse(record["url"]).path))


def _distribution_file(distribution: str, name: str) -> str | None:
    try:
        return metadata.distribution(distribution).read_text(name)
    except metadata.PackageNotFoundError:
        return None


def git_head(folder: Path) -> str | None:
    """The commit a git work tree has checked out, read from its files (no git process: the Snakefile calls
    this while it parses); None when `folder` is no git work tree or its HEAD cannot be resolved."""
    git = folder / ".git"
    if git.is_file():  # a worktree or submodule: "gitdir: <path>"
        git = (folder / git.read_text().split(":", 1)[1].strip()).resolve()
    head_file = git / "HEAD"
    if not head_file.is_file():
        return None
    head = head_file.read_text().strip()
    if COMMIT.fullmatch(head):
        return head
    ref = head.removeprefix("ref: ")
    if (git / ref).is_file():
        return (git / ref).read_text().strip()
    packed = git / "packed-refs"
    if packed.is_file():
        for line in packed.read_text().splitlines():
            if line.endswith(f" {ref}"):
                return line.split()[0]
    return None


def release_pins(stack: NeuronStack) -> dict[str, Any]:
    """The release's pip components and the fork as pins beside workflow/envs/neuron.txt's ({name: Pin}): the stages
    take their stamps as on cpu, so a release whose torch-neuronx (say) moved reruns what runs it. An
    unrecorded version is the pin UNRECORDED, which admits nothing."""
    from .pins import Pin

    versions = {**stack.pip_packages, stack.fork.distribution: stack.fork.version}
    return {name: Pin(name, UNRECORDED if version == UNRECORDED else f"=={version}")
            for name, version in versions.items()}


def fork_head_files(stack: NeuronStack) -> list[str]:
    """The file holding the installed fork clone's checked-out commit (a detached HEAD after the install), as
    the fork's stamp's input: a checkout of another commit reruns the stamp and what uses torchtitan. Empty
    when the fork is not installed editable from a git clone (the cpu backend's torchtitan)."""
    source = editable_source(stack.fork.distribution)
    head = source / ".git" / "HEAD" if source else None
    return [str(head)] if head and head.is_file() else []


def installed_commit(distribution: str) -> str | None:
    """The commit a distribution installed editable from a git clone imports from (its source folder's HEAD);
    None for any other install."""
    source = editable_source(distribution)
    return git_head(source) if source else None


def stack_record(stack: NeuronStack, installed: Callable[[str], str], system: dict[str, str],
                 commit: str | None) -> dict[str, Any]:
    """Every component of the release with the version installed: the pip components (`installed`), the OS
    packages (`system`, as the neuron backend reads them), and the fork with its commit. `ok` per row; the
    record's `ok` is all of them."""
    rows = []
    for name, version in stack.pip_packages.items():
        have = installed(name)
        rows.append({"component": name, "kind": "pip", "release": version, "installed": have,
                     "ok": have != NOT_INSTALLED and release_admits(version, have)})
    for name, version in stack.os_packages.items():
        have = system.get(name, NOT_INSTALLED)
        rows.append({"component": name, "kind": OS_PACKAGE, "release": version, "installed": have,
                     "ok": release_admits(version, have) if have[:1].isdigit() else False})
    fork = stack.fork
    have = installed(fork.distribution)
    rows.append({"component": fork.distribution, "kind": f"git {fork.url}", "release": f"{fork.version} @ {fork.ref}",
                 "installed": f"{have} @ {commit or 'no git commit found'}",
                 "ok": have == fork.version and commit is not None and (not fork.pinned or commit == fork.ref)})
    return {"sdk_release": stack.release, "stack_file": stack.path, "fork_commit": commit,
            "fork_pinned": fork.pinned, "components": rows, "ok": all(r["ok"] for r in rows)}


def releases_carrying(os_installed: dict[str, str], stacks: list[NeuronStack]) -> list[str]:
    """The releases whose OS packages among `os_installed` (each one recorded) are all at the versions
    installed: which SDK an instance's driver, runtime, collectives and tools (or one of them) belong to."""
    def carries(stack: NeuronStack) -> bool:
        recorded = {name: v for name, v in stack.os_packages.items() if v != UNRECORDED and name in os_installed}
        return bool(recorded) and all(release_admits(v, os_installed[name]) for name, v in recorded.items())

    return [stack.release for stack in stacks if carries(stack)]


def switch_fix(release: str) -> str:
    """The one-line fix when an instance carries `release`'s OS packages."""
    return f"set neuron.sdk: {release} (config/trn2.yaml)"


def os_release_note(stack: NeuronStack, record: dict[str, Any], stacks: list[NeuronStack]) -> str | None:
    """When the instance's OS packages are not the chosen release's: the release they belong to, and the
    one-line fix."""
    os_rows = [row for row in record["components"] if row["kind"] == OS_PACKAGE]
    if all(row["ok"] for row in os_rows):
        return None
    installed = {row["component"]: row["installed"] for row in os_rows}
    shown = ", ".join(f"{name} {version}" for name, version in installed.items())
    dlami = f"SDK {stack.release}'s DLAMI ({stack.machine.dlami or 'unrecorded'})"
    others = [release for release in releases_carrying(installed, stacks) if release != stack.release]
    if others:
        return (f"this instance carries SDK {others[-1]}'s OS packages ({shown}): {switch_fix(others[-1])}, "
                f"or launch {dlami}")
    return (f"this instance's OS packages ({shown}) belong to no release recorded in {SDK_FOLDER}/ "
            f"({', '.join(s.release for s in stacks)}): launch {dlami}, or record the release they come with")


def installed_record(stack: NeuronStack, project: Path = PROJECT) -> dict[str, Any]:
    """stack_record for this interpreter and this machine (OS packages read as the neuron backend reads them),
    with the release the instance's OS packages belong to where it is not this one."""
    from .backends.neuron.machine import read_system_versions

    # Not pins.installed_version: pins imports `packaging`, and this runs as the install's last step, in a venv
    # whose packages are whatever the install put there.
    def installed(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return NOT_INSTALLED

    system = {name: value for name, value in read_system_versions().items() if name in stack.os_packages}
    record = stack_record(stack, installed, system, installed_commit(stack.fork.distribution))
    record["os_packages_note"] = os_release_note(stack, record, read_releases(project))
    return record


def check_record(record: dict[str, Any]) -> None:
    """Raises StackError with each component that is not at the release's version."""
    differs = [row for row in record["components"] if not row["ok"]]
    if differs:
        raise StackError(f"the installed Neuron stack is not SDK {record['sdk_release']}'s ({record['stack_file']}):\n"
                         + format_record({**record, "components": differs}))


def format_record(record: dict[str, Any]) -> str:
    header = ("component", "release", "installed", "ok")
    rows = [{**r, "ok": "ok" if r["ok"] else "DIFFERS"} for r in record["components"]]
    widths = [max(len(h), *(len(str(r[h])) for r in rows)) for h in header]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(str(r[h]).ljust(w) for h, w in zip(header, widths, strict=True)) for r in rows]
    if any(r["release"] == UNRECORDED or r["release"].startswith(f"{UNRECORDED} ") for r in record["components"]):
        lines.append(f"an unrecorded version is never taken as the release's: check the installed one against "
                     f"AWS's release notes and write it into {record['stack_file']}")
    if record.get("os_packages_note"):
        lines.append(record["os_packages_note"])
    if not record["fork_pinned"]:
        lines.append(f"the fork's ref is not a commit: to pin this tree, set [fork] ref = "
                     f"\"{record['fork_commit']}\" in {record['stack_file']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qwen3_pilot.neuron_stack", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sdk", required=True, help=f"the release ({SDK_FOLDER}/<release>.toml; config neuron.sdk)")
    sub = parser.add_subparsers(dest="command", required=True)
    install = sub.add_parser("install", help="build the venv for the release on this machine and install into it")
    install.add_argument("--venv", type=Path, default=Path(".venv-neuron"))
    install.add_argument("--python", default="python3", help="the interpreter for a venv of the standalone wheels")
    install.add_argument("--root", type=Path, default=Path("/"),
                         help="the file system root where /etc/os-release and the DLAMI's venv are looked for")
    install.add_argument("--dry-run", action="store_true", help="print the steps, run nothing")
    sub.add_parser("record", help="this interpreter's stack against the release; non-zero when a component differs")
    lock = sub.add_parser("lock", help="the release's hash lock (pip-tools), from the venv the install made")
    lock.add_argument("--venv", type=Path, default=Path(".venv-neuron"))
    args = parser.parse_args(argv)
    project = Path.cwd()  # the project's root: make runs this there
    try:
        stack = read_release(args.sdk, project)
        if args.command == "record":
            record = installed_record(stack, project)
            print(format_record(record))
            if any(not row["ok"] for row in record["components"] if row["kind"] == OS_PACKAGE):
                print(f"OS packages differ: they come with the Neuron DLAMI or AWS's apt repository, not with this "
                      f"install; pin_env fails until they are SDK {stack.release}'s")
            # Non-zero when what this install put in place (the pip packages, the fork) is not the release's.
            return 0 if all(row["ok"] for row in record["components"] if row["kind"] != OS_PACKAGE) else 1
        if args.command == "lock":
            command = lock_command(stack, sys.executable, args.venv.absolute(), project)
            print(f"$ {shlex.join(command)}", flush=True)
            return subprocess.run(command).returncode
        layout = machine_layout(stack, args.root, args.python)
    except StackError as error:
        print(f"install-neuron: {error}" if args.command == "install" else str(error), file=sys.stderr)
        return 2
    print(f"SDK {stack.release} ({stack.path}) on {layout.os}: {layout.kind} layout, Python from {layout.base_python}")
    steps = install_steps(stack, layout, args.venv.absolute(), project)
    if args.dry_run:
        for step in steps:
            print(f"# {step.what}\n{shlex.join(step.command)}")
        return 0
    return run_install(steps)


if __name__ == "__main__":
    sys.exit(main())
