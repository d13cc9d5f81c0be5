"""What is installed, recorded against a release: each component's version and where it came from, the fork's
commit, and how the machine's OS packages compare (pin_env, `python -m qwen3_pilot.backends.neuron.stack record`).
Standard library only, as the whole package."""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from ....paths import PROJECT
from . import (
    COMMIT,
    NOT_INSTALLED,
    OS_PACKAGE,
    SDK_FOLDER,
    UNRECORDED,
    NeuronStack,
    StackError,
    read_releases,
    release_admits,
)

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
    from ....pins import Pin

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
    from ..machine import read_system_versions

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
