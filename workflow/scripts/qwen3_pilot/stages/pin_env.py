"""Stage pin_env: each pinned package against the installed version (rule pin_package, one stamp per package),
then the whole environment for the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..pins import (
    Pin,
    PinError,
    check_pin,
    environment_facts,
    format_drift,
    format_table,
    installed_distributions,
    installed_version,
    lock_drift,
    read_lock,
)


def run_package(package: str, pinned: str, out: Path) -> dict[str, Any]:
    """Checks one pin against the version installed now and writes its stamp; a mismatch writes nothing. A
    package installed editable from a git clone (the neuron backend's fork) records the clone's commit too."""
    from ..backends.neuron.stack import UNRECORDED
    from ..backends.neuron.stack.installed import installed_commit

    installed = installed_version(package)
    if pinned == UNRECORDED:
        raise PinError(f"{package}: the Neuron SDK release file (workflow/envs/neuron-sdk/) records no version for it "
                       f"({UNRECORDED}); this environment has {installed}: check that against AWS's release notes "
                       "for the release and write it there")
    row = check_pin(Pin(package, pinned), installed)
    commit = installed_commit(package)
    if commit:
        row["commit"] = commit
    from ..artifacts import write_recorded_json

    write_recorded_json(out, row)  # the stages that consume the stamp hold it to this sha256
    return row


def run_os_package(package: str, pinned: str, out: Path, project: Path | None = None,
                   read: Any = None) -> dict[str, Any]:
    """One OS package of the Neuron SDK release (driver, runtime, collectives, tools) against the version this
    instance has (dpkg-query or rpm); a mismatch writes nothing and names the releases that ship the installed
    version, with the one-line fix."""
    from ..artifacts import write_recorded_json
    from ..backends.neuron.machine import read_os_packages
    from ..backends.neuron.stack import UNRECORDED, read_releases, release_admits
    from ..backends.neuron.stack.installed import releases_carrying, switch_fix
    from ..paths import PROJECT

    installed = (read or read_os_packages)([package])[package]
    row = {"package": package, "pinned": pinned, "installed": installed, "kind": "os package",
           "ok": release_admits(pinned, installed)}
    if not row["ok"]:
        stacks = read_releases(project or PROJECT)
        shipping = releases_carrying({package: installed}, stacks)
        hint = (f"{installed} is SDK {', '.join(shipping)}'s: {switch_fix(shipping[-1])}, or "
                "launch the chosen release's DLAMI" if shipping else
                f"no release recorded in workflow/envs/neuron-sdk/ ({', '.join(s.release for s in stacks)}) ships "
                f"{installed}"
                + ("; the chosen release's version is unrecorded: check the installed one against AWS's release "
                   "notes and write it into its file" if pinned == UNRECORDED else ""))
        raise PinError(f"OS package {package}: the Neuron SDK release pins {pinned}, this instance has {installed}: "
                       f"{hint}")
    write_recorded_json(out, row)
    return row


def check_lock(lock_file: Path | None, installed: dict[str, str] | None = None,
               unlocked: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every installed distribution against the hash lock (workflow/envs/<backend>.lock): its digest, and a PinError
    with the table of each package that differs. No lock (the neuron backend, locked on the instance): the
    record says the environment is unlocked."""
    from ..artifacts import sha256_file
    from ..stage_progress import record_measured

    if lock_file is None:
        return {"file": None, "locked_environment": False}
    locked = read_lock(lock_file)
    drift = lock_drift(locked, installed_distributions() if installed is None else installed, unlocked)
    record = {"file": str(lock_file), "sha256": sha256_file(lock_file), "packages": len(locked), "drift": drift,
              "locked_environment": not drift}
    if drift:
        record_measured(lock_drift=drift)  # the failed stage's report shows the table
        raise PinError(f"the installed environment differs from {lock_file} ({len(drift)} package(s); "
                       "reinstall with make, or regenerate the lock with make lock):\n" + format_drift(drift))
    return record


def run(
    stamps: list[Path], backend: dict[str, Any], pins_file: str, lock_file: Path | None, cache_root: str, out: Path,
    sdk_release: str | None = None,
) -> dict[str, Any]:
    from ..backends import make_backend
    from ..stage_progress import record_measured
    from ..summary import StageSummary

    rows = [json.loads(Path(p).read_text()) for p in stamps]
    record_measured(packages=rows)
    bad = [r for r in rows if not r["ok"]]
    if bad:
        raise PinError("pinned versions not installed:\n" + format_table(bad))
    figures = {}
    unlocked: tuple[str, ...] = ()
    if backend["backend"] == "neuron":
        # Every component of the SDK release config neuron.sdk names, the fork's commit with them.
        from ..backends.neuron.stack import read_release
        from ..backends.neuron.stack.installed import check_record, installed_record

        stack = read_release(sdk_release)
        unlocked = (stack.fork.distribution,)  # from its git clone, checked by its commit, not by the lock
        figures["neuron_sdk"] = installed_record(stack)
        record_measured(neuron_sdk=figures["neuron_sdk"])  # a failed stage's report shows the table
        check_record(figures["neuron_sdk"])
    lock = check_lock(lock_file, unlocked=unlocked)
    summary = StageSummary(
        stage="pin_env",
        status="pass",
        backend=backend["backend"],
        figures={
            "pins_file": pins_file,
            "packages": rows,
            "lock": lock,
            "environment": environment_facts(),
            "system": make_backend(backend, cache_root).system_versions(),
            **figures,
        },
        proves=f"Every package pinned in {pins_file} is installed at its pinned version in the environment "
        "that ran the stages"
        + (f", and every installed distribution is at the version {lock['file']} (sha256 {lock['sha256'][:12]}) "
           f"locks ({lock['packages']} packages), none missing and none unlocked." if lock["file"] else
           "; this backend has no lock file, so the other packages are recorded by nothing."),
        does_not_prove="That the pinned versions are the right ones; that the installed files are the ones the lock's "
        "hashes name (pip checks that when make installs from the lock, not afterwards); or the system libraries "
        "outside pip (driver, runtime, libc).",
    )
    summary.add_artifacts([Path(p) for p in stamps])
    return summary.write(out)
