"""The code a stage runs, as one digest that decides whether the stage reruns (each rule's `params.code`:
Snakemake's params trigger reruns a job whose params changed), and the commit it ran at.

A stage's code is its thin script under workflow/scripts/ and every module of the package that it can run:
those it imports, at module level or inside a function, directly or through other modules, with their
packages' __init__ files, and those it starts by name (a string naming a package module, as in torchrun's
`-m qwen3_pilot.titan.in_ranks.train_entry`: code that runs in the ranks). Backend modules are loaded by name
from the config (backends.backend_module): the rules add the configured backend's as a root.

Each file counts as what runs, not as its bytes: its syntax tree without docstrings (a tree has no comments
and no layout). A comment, a reflowed line or a reworded docstring reruns nothing; any change to a statement,
a name or a constant reruns every stage whose code holds that module. The closure is by module, not by
function: a stage reruns when any module it can run changes, used or not - which is why a stage's judging
lives in modules its measuring does not import (stages/*_judging.py), so that a judge edit re-judges.

Torch-free and read at parse time: a file is parsed only when its bytes are new to the workflow folder's
cache (CodeCache); otherwise it is read and hashed.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..paths import PACKAGE, SCRIPTS, WORKFLOW

PACKAGE_NAME = PACKAGE.name


@dataclass(frozen=True)
class ModuleCode:
    """One file's digest (of its tree without docstrings) and the package modules it names (imports, or starts
    by name), with their parent packages: those with a file are what it may run."""

    digest: str
    names: tuple[str, ...]

    def runs(self) -> list[Path]:
        return [path for name in self.names if (path := module_file(name)) is not None]


@functools.cache  # one parse's answers: files are not added or removed meanwhile
def module_file(name: str) -> Path | None:
    """The file of package module `name` (a module or a package's __init__), None if there is none."""
    parts = name.split(".")
    if parts[0] != PACKAGE_NAME:
        return None
    base = SCRIPTS.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def module_name(path: Path) -> str | None:
    """The package module a file under the package is (None for a file outside it: a thin script)."""
    try:
        relative = path.resolve().relative_to(SCRIPTS)
    except ValueError:
        return None
    if relative.parts[0] != PACKAGE_NAME:
        return None
    parts = relative.with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def without_docstrings(tree: ast.Module) -> ast.Module:
    """`tree` with the docstring of the module and of each class and function removed (a lone docstring body
    becomes `pass`)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


def _absolute(module: str | None, level: int, importer: str | None, is_package: bool) -> str | None:
    """`from <level dots><module> import ...` in `importer`, as an absolute module name."""
    if level == 0:
        return module
    if importer is None:
        return None  # a relative import in a script: not a package module
    parts = importer.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _with_parents(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def parse_module(source: bytes, filename: str, importer: str | None, is_package: bool) -> ModuleCode:
    tree = without_docstrings(ast.parse(source, filename=filename))
    named: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module, node.level, importer, is_package)
            if base is not None:
                named.add(base)
                named.update(f"{base}.{alias.name}" for alias in node.names)  # a submodule imported by name
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and node.value.startswith(f"{PACKAGE_NAME}."):
            named.add(node.value)  # a module started by name (python -m, torchrun, --module)
    names = sorted({parent for name in named if name.split(".")[0] == PACKAGE_NAME for parent in _with_parents(name)})
    digest = hashlib.sha256(ast.dump(tree, include_attributes=False).encode()).hexdigest()
    return ModuleCode(digest, tuple(names))


class CodeCache:
    """Each file's ModuleCode by its bytes' sha256 (and its module name), kept in `path` between processes:
    parsing the package takes about 0.5 s, reading and hashing it a few milliseconds. None: kept in memory only."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.entries: dict[str, list] = {}
        if path is not None and path.is_file():
            try:
                self.entries = json.loads(path.read_text())
            except ValueError:
                self.entries = {}  # a damaged cache is rebuilt
        self.changed = False
        # Each file read and hashed once per process: a parse asks for the shared modules once per rule.
        self.by_path: dict[Path, ModuleCode] = {}

    def module(self, path: Path) -> ModuleCode:
        if path in self.by_path:
            return self.by_path[path]
        source = path.read_bytes()
        name = module_name(path)
        is_package = path.name == "__init__.py"
        key = f"{hashlib.sha256(source).hexdigest()} {name} {is_package}"
        if key not in self.entries:
            code = parse_module(source, str(path), name, is_package)
            self.entries[key] = [code.digest, list(code.names)]
            self.changed = True
        digest, names = self.entries[key]
        self.by_path[path] = ModuleCode(digest, tuple(names))
        return self.by_path[path]

    def save(self) -> None:
        if self.path is None or not self.changed:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Atomic: Snakemake processes started together (cluster jobs) may write it at once.
        with tempfile.NamedTemporaryFile("w", dir=self.path.parent, delete=False, suffix=".tmp") as handle:
            json.dump(self.entries, handle)
        os.replace(handle.name, self.path)
        self.changed = False


@dataclass(frozen=True)
class StageCode:
    """The code of one stage: the digest over its files' digests, and the files (relative to workflow/)."""

    digest: str
    files: tuple[str, ...]


def stage_code(script: Path, backend: str, cache: CodeCache | None = None) -> StageCode:
    """The code `script` runs (see the module's docstring). The backends package loads the configured
    `backend`'s module by name (backends.backend_module): where the backends package is run, so is it."""
    cache = cache or CodeCache()
    backends, backend_file = module_file(f"{PACKAGE_NAME}.backends"), module_file(f"{PACKAGE_NAME}.backends.{backend}")
    files: dict[Path, ModuleCode] = {}
    pending = [script.resolve()]
    while pending:
        path = pending.pop()
        if path in files:
            continue
        files[path] = code = cache.module(path)
        pending.extend(code.runs())
        if path == backends and backend_file is not None:
            pending.append(backend_file)
    cache.save()
    relative = {(path.relative_to(WORKFLOW) if path.is_relative_to(WORKFLOW) else path).as_posix(): code.digest
                for path, code in files.items()}
    listing = "".join(f"{name} {relative[name]}\n" for name in sorted(relative))
    return StageCode(hashlib.sha256(listing.encode()).hexdigest(), tuple(sorted(relative)))


def git_provenance(folder: Path) -> dict[str, Any]:
    """The commit checked out in `folder` and whether tracked files differ from it."""

    def git(*args: str) -> str | None:
        try:
            result = subprocess.run(["git", *args], cwd=folder, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return result.stdout.strip() if result.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit or "unknown (not a git checkout)", "dirty": bool(dirty)}
