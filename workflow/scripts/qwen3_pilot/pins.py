"""Pins per backend (envs/<backend>.txt) against what is installed.

Each tracked package gets its own stamp (rule `pin_package`), so a bump of one pin re-runs only the
stages that take that package's stamp as input: Snakemake has no early cutoff.
"""

from __future__ import annotations

import importlib.metadata
import platform
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
        if installed == NOT_INSTALLED:
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
    header = ("package", "pinned", "installed")
    widths = [max(len(header[i]), *(len(str(r[k])) for r in rows)) for i, k in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(str(r[k]).ljust(w) for k, w in zip(header, widths)) for r in rows]
    return "\n".join(lines)


def environment_facts() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "machine": platform.machine(),
    }
