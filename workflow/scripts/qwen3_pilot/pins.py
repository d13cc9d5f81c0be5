"""Pins per backend (workflow/envs/<backend>.txt) and the hash lock made from them (workflow/envs/<backend>.lock),
against what is installed.

Each tracked package gets its own stamp (rule `pin_package`), so a bump of one pin re-runs only the
stages that take that package's stamp as input (and fetch_weights' consumers only when the bytes it fetches
change: docs/reruns.md). The lock pins every package
of the environment, the pins' dependencies too; pin_env compares every installed distribution with it.
"""

from __future__ import annotations

import importlib.metadata
import platform
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

NOT_INSTALLED = "not installed"


class PinError(RuntimeError):
    pass


@dataclass(frozen=True)
class Pin:
    package: str
    specifier: str

    def admits(self, installed: str) -> bool:
        # Not an exact pin: a Neuron SDK release file's "unrecorded" version, which admits nothing.
        if installed == NOT_INSTALLED or not self.specifier.startswith("=="):
            return False
        try:
            return Requirement(f"{self.package}{self.specifier}").specifier.contains(
                Version(installed), prereleases=True
            )
        except InvalidVersion:
            return False


def read_pins(path: Path) -> dict[str, Pin]:
    """Parses a requirements file of exact (==) pins; anything looser is a config error."""
    pins: dict[str, Pin] = {}
    for number, raw in enumerate(Path(path).read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            requirement = Requirement(line)
        except InvalidRequirement as error:
            raise PinError(f"{path}:{number}: {line!r} is not a requirement ({error})") from None
        specs = list(requirement.specifier)
        if len(specs) != 1 or specs[0].operator not in ("==", "==="):
            raise PinError(f"{path}:{number}: {line!r} must pin one exact version with '=='")
        name = canonicalize_name(requirement.name)
        if name in pins:
            raise PinError(f"{path}:{number}: {name} is pinned twice")
        pins[name] = Pin(name, str(requirement.specifier))
    return pins


# Installed, but by `pip install -e .` after the locked packages (make): the project itself is not locked.
PROJECT_DISTRIBUTION = "qwen3-pilot"
LOCK_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def read_lock(path: Path) -> dict[str, str]:
    """A pip-compile lock's pins, {canonical name: version}; anything but exact pins with hashes is an error."""
    locked: dict[str, str] = {}
    lines = Path(path).read_text().splitlines()
    for number, line in enumerate(lines, start=1):
        if not line or line.startswith((" ", "#")):
            continue
        match = LOCK_LINE.match(line)
        if match is None:
            raise PinError(f"{path}:{number}: {line!r} is not an exact pin (name==version); regenerate with make lock")
        following = lines[number] if number < len(lines) else ""
        if "--hash=sha256:" not in following:
            raise PinError(f"{path}:{number}: {match.group(1)} has no --hash lines; regenerate with make lock")
        locked[canonicalize_name(match.group(1))] = match.group(2)
    return locked


def installed_distributions() -> dict[str, str]:
    """Every distribution this interpreter imports from, {canonical name: version}; where two copies are on
    the path, the one found first (the one `import` uses)."""
    installed: dict[str, str] = {}
    for distribution in importlib.metadata.distributions():
        name = distribution.metadata["Name"]
        if name:
            installed.setdefault(canonicalize_name(name), distribution.version)
    return installed


def lock_drift(locked: dict[str, str], installed: dict[str, str],
               unlocked: tuple[str, ...] = ()) -> list[dict[str, str]]:
    """Each package whose installed version is not the locked one: locked and not installed, installed at
    another version, or installed and not in the lock (the project itself and `unlocked` excepted: the neuron
    backend's fork comes from its git clone and is checked by its commit)."""
    rows = []
    for name in sorted((set(locked) | set(installed)) - {PROJECT_DISTRIBUTION, *unlocked}):
        want, have = locked.get(name, "not locked"), installed.get(name, NOT_INSTALLED)
        if not same_version(want, have):
            rows.append({"package": name, "locked": want, "installed": have})
    return rows


def same_version(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def format_drift(rows: list[dict[str, str]]) -> str:
    return format_rows(rows, ("package", "locked", "installed"))


def installed_version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return NOT_INSTALLED


def check_pin(pin: Pin, installed: str) -> dict[str, Any]:
    row = {"package": pin.package, "pinned": pin.specifier, "installed": installed, "ok": pin.admits(installed)}
    if not row["ok"]:
        raise PinError("pinned version not installed:\n" + format_table([row]))
    return row


def format_table(rows: list[dict[str, Any]]) -> str:
    return format_rows(rows, ("package", "pinned", "installed"))


def format_rows(rows: list[dict[str, Any]], header: tuple[str, ...]) -> str:
    widths = [max(len(header[i]), *(len(str(r[k])) for r in rows)) for i, k in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(str(r[k]).ljust(w) for k, w in zip(header, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def environment_facts() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "machine": platform.machine(),
    }
