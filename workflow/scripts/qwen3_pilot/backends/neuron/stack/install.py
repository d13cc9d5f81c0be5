"""A release's install on this machine: where it goes (the DLAMI's venv, or a venv of the standalone wheels on a
supported OS) and its steps in AWS's documented order. Standard library only, as the whole package."""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ....paths import PROJECT
from . import FORK_CLONE, PINS_FILE, NeuronStack, StackError

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
             [python, "-m", "qwen3_pilot.backends.neuron.stack", "--sdk", stack.release, "record"]),
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
