"""The Neuron software stack as AWS ships it for one SDK release (workflow/envs/neuron-sdk/<release>.toml, picked by
config neuron.sdk): the pins the stages depend on, its install on a trn2, and what pin_env and the preflight
check against it.

AWS ships the stack in three ways at once: torch-neuronx, neuronx-cc and nki from AWS's own pip repository
(with PyTorch's CPU index for torch), the driver, runtime, collectives and tools as OS packages, and
TorchTitan Neuron only as a git repository installed editable from a clone. On its DLAMI a release's pip
components come preinstalled in AWS's venv. `install_steps` follows AWS's documented order;
`python -m qwen3_pilot.backends.neuron.stack --sdk R install` (make install-neuron) runs it.

- this module: a release's file read and compared (with the pins, with AWS's component list, with another release);
- install.py: the machine's layout (DLAMI or standalone wheels) and the install's steps;
- installed.py: what is installed, recorded against the release (pin_env, `record`).

Standard library only: the install runs with the machine's own python3, before any venv exists.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ....paths import PROJECT

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
