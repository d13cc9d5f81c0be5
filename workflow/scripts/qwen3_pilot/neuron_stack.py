"""The Neuron software stack as AWS ships it for one SDK release (envs/neuron-sdk.toml): its install on a
trn2, and what pin_env and the preflight check against it.

AWS ships the stack in three ways at once: torch-neuronx, neuronx-cc and nki from AWS's own pip repository
(with PyTorch's CPU index for torch), the driver, runtime, collectives and tools as OS packages, and
TorchTitan Neuron only as a git repository installed editable from a clone. `install_steps` follows AWS's
documented order for SDK 2.33; `python -m qwen3_pilot.neuron_stack install` (make install-neuron) runs it.

Standard library only: the install runs with the interpreter of a new venv, before anything else is in it.
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
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from .paths import PROJECT

STACK_FILE = "envs/neuron-sdk.toml"
PINS_FILE = "envs/neuron.txt"
LOCK_FILE = "envs/neuron.lock"
# Where the install clones the fork (ignored by git): its editable install imports from here.
FORK_CLONE = "vendor/torchtitan-neuron"
COMMIT = re.compile(r"[0-9a-f]{40}")
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


@dataclass(frozen=True)
class NeuronStack:
    path: str
    release: str
    released: str
    extra_indexes: tuple[str, ...]
    python: dict[str, str]  # pip component -> the release's version (may end in .*)
    system: dict[str, str]  # OS package -> the release's version
    fork: Fork

    def index_options(self) -> list[str]:
        return [option for url in self.extra_indexes for option in ("--extra-index-url", url)]


def read_stack(path: Path | str = PROJECT / STACK_FILE) -> NeuronStack:
    """envs/neuron-sdk.toml, every key it must have checked; StackError names the file and the key."""
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

    release, released = text("sdk", "release"), text("sdk", "released")
    indexes = table("indexes").get("extra")
    if not isinstance(indexes, list) or not all(isinstance(u, str) and u.startswith("https://") for u in indexes):
        raise StackError(f"{path}: [indexes] extra must be a list of https:// URLs, got {indexes!r}")
    versions = {}
    for section in ("python", "system"):
        for name, version in table(section).items():
            if not isinstance(version, str) or not re.fullmatch(r"\d+(\.\d+)*(\.\*)?", version):
                raise StackError(f"{path}: [{section}] {name} = {version!r} is not a version like 2.28.7631.0")
        versions[section] = dict(table(section))
    return NeuronStack(
        path=str(path), release=release, released=released,
        extra_indexes=tuple(indexes), python=versions["python"], system=versions["system"],
        fork=Fork(url=text("fork", "url"), ref=text("fork", "ref"), version=text("fork", "version"),
                  distribution=text("fork", "distribution")),
    )


def release_admits(release_version: str, installed: str) -> bool:
    """The release's version (2.28.7631.0, or a family 2.14.3.0.*) against an installed one; a local label
    (+abc) and a Debian revision (-1) are not part of the release's number."""
    number = re.split(r"[+-]", installed, maxsplit=1)[0]
    if release_version.endswith(".*"):
        return (number + ".").startswith(release_version[:-1])
    return number == release_version


def pin_problems(stack: NeuronStack, pins: dict[str, Any]) -> list[str]:
    """envs/neuron.txt against the stack: each of the release's pip components pinned to the release's version,
    and the fork not pinned there (no index serves it; the stack file's [fork] installs it). `pins` are
    pins.read_pins' {name: Pin}."""
    problems = []
    for name, version in stack.python.items():
        pin = pins.get(name)
        if pin is None:
            problems.append(f"{PINS_FILE} does not pin {name} (SDK {stack.release}: {version})")
        elif pin.specifier != f"=={version}":
            problems.append(f"{PINS_FILE} pins {name}{pin.specifier}; SDK {stack.release} ships {name} {version} "
                            f"({stack.path} [python])")
    if stack.fork.distribution in pins:
        problems.append(f"{PINS_FILE} pins {stack.fork.distribution}, which no index serves: TorchTitan Neuron is "
                        f"installed from {stack.fork.url} ({stack.path} [fork])")
    return problems


def components_problems(stack: NeuronStack, published: str) -> list[str]:
    """The stack's versions against AWS's published component list as recorded in
    workflow/resources/neuron/sdk-<release>-components.md (its table rows: | component | version | how |)."""
    problems = []
    table = published.lower()
    title = published.splitlines()[0] if published.strip() else ""
    if f"SDK {stack.release} " not in f"{title} ":
        problems.append(f"the published list is not SDK {stack.release}'s (its title: {title!r})")
    for name, version in {**stack.python, **stack.system, stack.fork.distribution: stack.fork.version}.items():
        shown = version.removesuffix(".*")
        if not re.search(rf"\|[^|\n]*\|\s*{re.escape(shown)}[\s|(]", table):
            problems.append(f"{name} {version}: no row of the published list has version {shown}")
    return problems


# ---- the install ----


@dataclass(frozen=True)
class Step:
    what: str
    command: list[str]
    # Run only when this path does not exist yet (the clone: a rerun fetches into the existing one).
    unless_exists: Path | None = None


def install_steps(stack: NeuronStack, python: str, project: Path = PROJECT) -> list[Step]:
    """AWS's order for SDK 2.33: the Neuron packages (with the rest of envs/neuron.txt, or its hash lock when
    one was made on an instance) from AWS's repository and PyTorch's CPU index beside PyPI; the fork cloned and
    checked out at its ref, its requirements.txt and itself installed editable, neither allowed to move a pin
    of envs/neuron.txt; then this project, without dependencies; then pip's consistency check."""
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check"]
    indexes = stack.index_options()
    lock, pins = project / LOCK_FILE, project / PINS_FILE
    clone = project / FORK_CLONE
    packages = ["--require-hashes", "-r", str(lock)] if lock.exists() else ["-r", str(pins)]
    constrained = ["-c", str(pins), *indexes]
    return [
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
        Step(f"the installed stack against SDK {stack.release}", [python, "-m", "qwen3_pilot.neuron_stack", "record"]),
    ]


def lock_command(stack: NeuronStack, python: str, project: Path = PROJECT) -> list[str]:
    """envs/neuron.lock from envs/neuron.txt and the cloned fork's requirements.txt: every package pinned with
    the sha256 of each of its files on the indexes (pip-tools, as envs/cpu.lock); run on the instance after the
    install, and commit the lock: the next install takes it (install_steps)."""
    return [python, "-m", "piptools", "compile", "--quiet", "--allow-unsafe", "--generate-hashes",
            "--no-emit-index-url", "--no-emit-find-links", "--strip-extras", *stack.index_options(),
            "--output-file", str(project / LOCK_FILE), str(project / PINS_FILE),
            str(project / FORK_CLONE / "requirements.txt")]


def run_install(stack: NeuronStack, python: str, project: Path = PROJECT,
                run: Callable[[list[str]], int] | None = None, echo: Callable[[str], None] = print) -> int:
    """Runs install_steps, each command printed before it runs; stops at the first that fails, naming it."""
    run = run or (lambda command: subprocess.run(command).returncode)
    steps = install_steps(stack, python, project)
    for number, step in enumerate(steps, start=1):
        if step.unless_exists is not None and step.unless_exists.exists():
            echo(f"[{number}/{len(steps)}] {step.what}: {step.unless_exists} exists, kept")
            continue
        echo(f"[{number}/{len(steps)}] {step.what}\n  $ {shlex.join(step.command)}")
        sys.stdout.flush()  # before the command's own output
        code = run(step.command)
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


def fork_pins(stack: NeuronStack) -> dict[str, Any]:
    """The fork as a pin beside envs/neuron.txt's ({distribution: Pin}): the stages that use torchtitan take
    its stamp as on cpu, and a new fork version reruns them."""
    from .pins import Pin

    return {stack.fork.distribution: Pin(stack.fork.distribution, f"=={stack.fork.version}")}


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
    for name, version in stack.python.items():
        have = installed(name)
        rows.append({"component": name, "kind": "pip", "release": version, "installed": have,
                     "ok": have != NOT_INSTALLED and release_admits(version, have)})
    for name, version in stack.system.items():
        have = system.get(name, NOT_INSTALLED)
        rows.append({"component": name, "kind": OS_PACKAGE, "release": version, "installed": have,
                     "ok": release_admits(version, have) if have[:1].isdigit() else False})
    fork = stack.fork
    have = installed(fork.distribution)
    wanted = f"{fork.version} @ {fork.ref}"
    rows.append({"component": fork.distribution, "kind": f"git {fork.url}", "release": wanted,
                 "installed": f"{have} @ {commit or 'no git commit found'}",
                 "ok": have == fork.version and commit is not None and (not fork.pinned or commit == fork.ref)})
    return {"sdk_release": stack.release, "stack_file": stack.path, "fork_commit": commit,
            "fork_pinned": fork.pinned, "components": rows, "ok": all(r["ok"] for r in rows)}


def installed_record(stack: NeuronStack) -> dict[str, Any]:
    """stack_record for this interpreter and this machine (OS packages read as the neuron backend reads them)."""
    from .backends.neuron import read_system_versions

    # Not pins.installed_version: pins imports `packaging`, and this runs as the install's last step, in a venv
    # whose packages are whatever the install put there.
    def installed(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return NOT_INSTALLED

    system = {name: value for name, value in read_system_versions().items() if name in stack.system}
    return stack_record(stack, installed, system, installed_commit(stack.fork.distribution))


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
    if not record["fork_pinned"]:
        lines.append(f"the fork's ref is not a commit: to pin this tree, set [fork] ref = "
                     f"\"{record['fork_commit']}\" in {record['stack_file']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qwen3_pilot.neuron_stack", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    install = sub.add_parser("install", help="install the stack into the interpreter given (a new venv's)")
    install.add_argument("--python", default=sys.executable)
    install.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    sub.add_parser("record", help="this interpreter's stack against the release; non-zero when a component differs")
    sub.add_parser("lock", help=f"{LOCK_FILE} from {PINS_FILE} and the fork's requirements.txt (pip-tools)")
    args = parser.parse_args(argv)
    project = Path.cwd()  # the project's root: make runs this there
    stack = read_stack(project / STACK_FILE)
    if args.command == "record":
        record = installed_record(stack)
        print(format_record(record))
        if any(not row["ok"] for row in record["components"] if row["kind"] == OS_PACKAGE):
            print(f"OS packages differ: they come with the Neuron DLAMI or AWS's apt repository, not with this "
                  f"install; pin_env fails until they are SDK {stack.release}'s")
        # Non-zero when what this install put in place (the pip packages, the fork) is not the release's.
        return 0 if all(row["ok"] for row in record["components"] if row["kind"] != OS_PACKAGE) else 1
    if args.command == "lock":
        command = lock_command(stack, sys.executable, project)
        print(f"$ {shlex.join(command)}", flush=True)
        return subprocess.run(command).returncode
    if args.dry_run:
        for step in install_steps(stack, args.python, project):
            print(f"# {step.what}\n{shlex.join(step.command)}")
        return 0
    return run_install(stack, args.python, project)


if __name__ == "__main__":
    sys.exit(main())
