"""`python -m qwen3_pilot.backends.neuron.stack --sdk R install | record | lock` (make install-neuron, make
lock-neuron)."""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

from . import OS_PACKAGE, SDK_FOLDER, StackError, read_release
from . import __doc__ as PACKAGE_DOC
from .install import install_steps, lock_command, machine_layout, run_install
from .installed import format_record, installed_record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qwen3_pilot.backends.neuron.stack",
                                     description=PACKAGE_DOC.split("\n\n")[0])
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
