"""Every torchtitan name this project uses (api_names.TORCHTITAN_API), checked against the installed torchtitan
before a trainer starts.

A version string says nothing about the API: the aws-neuron torchtitan fork reports "0.2.2+neuron.1"
(workflow/envs/neuron-sdk/), and upstream reported "0.2.2" for months while fields the recipes set arrived. So the
check looks for each name itself, and for the installed torchtitan's API level's names only (api_levels.py). A
torchtitan from before the config refactor is refused before any name is looked at (`config_api_problem`).
docs/torchtitan-compat.md has when upstream got each name, and which torchtitans run which recipe
(`make titan-compat`).

Importing this module imports neither torch nor torchtitan; `missing_api` imports the modules it checks.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from pathlib import Path
from typing import Any

from ..problems import problem_list
from .api_levels import installed_level
from .api_names import RECIPES, TORCHTITAN_API, ApiEntry


class TorchtitanApiError(RuntimeError):
    pass


# AWS's TorchTitan Neuron tutorial trains Qwen3 with `--module torchtitan_neuron.models.qwen3 --config
# qwen3_8b_tp4_fsdp16_sac` ("Tutorial: Run a basic TorchTitan training on Neuron", date-modified 2026-10-15): on
# neuron the native recipe starts from that config function where the installed fork has it, for the Neuron
# settings AWS ships with it, and from upstream's qwen3_32b otherwise (the cpu backend, a fork without it).
FORK_NATIVE_BASE = ("torchtitan_neuron.models.qwen3", "qwen3_8b_tp4_fsdp16_sac")
UPSTREAM_NATIVE_BASE = ("torchtitan.models.qwen3.config_registry", "qwen3_32b")


def native_base(backend: str) -> tuple[Any, str]:
    """The config function the native recipe starts from on `backend`, and its "module:function" name. The
    fork's module is looked up as torchtitan's --module does (module.config_registry, then the module); a
    fork module that exists but fails to import is an error, not a reason to fall back."""
    if backend == "neuron":
        module, name = FORK_NATIVE_BASE
        for candidate in (f"{module}.config_registry", module):
            try:
                found = importlib.import_module(candidate)
            except ModuleNotFoundError as error:
                if error.name and candidate.startswith(error.name):
                    continue  # that module (or a parent) is not there
                raise
            if hasattr(found, name):
                return getattr(found, name), f"{candidate}:{name}"
    module, name = UPSTREAM_NATIVE_BASE
    return getattr(importlib.import_module(module), name), f"{module}:{name}"


def missing_api(entries: tuple[ApiEntry, ...] = TORCHTITAN_API, backend: str | None = None,
                user: str | None = None) -> list[str]:
    """One message per name, field or parameter in `entries` that the installed torchtitan lacks;
    `backend` leaves out entries that only another backend uses, `user` those that user does not need, and
    the installed torchtitan's API level (api_levels.installed_level) those of the other levels."""
    messages: list[str] = []
    modules: dict[str, Any] = {}
    level = installed_level()
    for entry in entries:
        if (backend is not None and backend not in entry.backends) or (user is not None and user not in entry.users):
            continue
        if level not in entry.levels:
            continue
        messages += _entry_problems(entry, modules)
    return messages


def check_torchtitan_api(backend: str | None = None, entries: tuple[ApiEntry, ...] = TORCHTITAN_API,
                         user: str | None = None) -> None:
    """Raises TorchtitanApiError when the installed torchtitan predates the config API (config_api_problem),
    or listing everything `missing_api` finds for `user` (a recipe's config function; None: every user);
    silent when nothing is missing."""
    refused = config_api_problem()
    if refused:
        raise TorchtitanApiError(refused)
    missing = missing_api(entries, backend, user)
    if missing:
        who = f"the recipe {user}" if user in RECIPES else (user or "this project")
        raise TorchtitanApiError(
            problem_list(f"the installed torchtitan ({installed_torchtitan()}) lacks {len(missing)} name(s) {who} "
                         "uses", missing)
        )


def missing_by_user(backend: str | None = None, entries: tuple[ApiEntry, ...] = TORCHTITAN_API) -> dict[str, list[str]]:
    """missing_api per user (each recipe, then the stage modules): what each would be refused for."""
    users = dict.fromkeys(user for entry in entries for user in entry.users)
    return {user: missing_api(entries, backend, user) for user in sorted(users, key=_user_order)}


def _user_order(user: str) -> tuple[int, str]:
    return (RECIPES.index(user) if user in RECIPES else len(RECIPES), user)


def config_api_problem() -> str | None:
    """Why the installed torchtitan cannot run any recipe here at all, or None: releases before upstream's
    config refactor (2026-02-23, 9810191bb, #2386), such as 0.2.2 on PyPI, configure the trainer with TOML
    files (torchtitan.config.job_config.JobConfig) and have no Python config functions (--module/--config,
    torchtitan.trainer.Trainer.Config), which every recipe here is."""
    import importlib.util

    try:
        has_trainer = importlib.util.find_spec("torchtitan.trainer") is not None
        has_job_config = importlib.util.find_spec("torchtitan.config.job_config") is not None
    except ImportError as error:  # torchtitan itself, or its config package, cannot be imported
        return f"torchtitan cannot be imported: {type(error).__name__}: {error}"
    if not has_trainer and has_job_config:
        return (f"the installed torchtitan ({installed_torchtitan()}) predates upstream's config refactor of "
                "2026-02-23 (9810191bb, #2386): it is configured by TOML files (torchtitan.config.job_config), and the "
                "recipes here are Python config functions for --module/--config (torchtitan.trainer.Trainer.Config). "
                "Install torchtitan 0.3.0 (workflow/envs/cpu.txt) or the TorchTitan Neuron fork "
                "(workflow/envs/neuron-sdk/).")
    return None


def _entry_problems(entry: ApiEntry, modules: dict[str, Any]) -> list[str]:
    """What `entry` finds missing in its module, or, where it names other homes, in the first home that has
    the name (all of them failing: the main module's problems, with where else it was looked for)."""
    problems = _home_problems(entry, entry.module, modules)
    for home in entry.homes if problems else ():
        if not _home_problems(entry, home, modules):
            return []
    if problems and entry.homes:
        problems = [f"{problem}; not in {', '.join(entry.homes)} either" for problem in problems]
    return problems


def import_home(entry: ApiEntry) -> Any:
    """The entry's top-level name (e.g. CheckpointManager for "CheckpointManager.Config") from the first of
    its module and homes that holds everything the entry needs; TorchtitanApiError when none does."""
    modules: dict[str, Any] = {}
    for module in (entry.module, *entry.homes):
        if not _home_problems(entry, module, modules):
            return getattr(modules[module], entry.name.split(".")[0])
    raise TorchtitanApiError(f"the installed torchtitan ({installed_torchtitan()}): "
                             + "; ".join(_entry_problems(entry, modules)))


def _home_problems(entry: ApiEntry, module_name: str, modules: dict[str, Any]) -> list[str]:
    entry = dataclasses.replace(entry, module=module_name)
    reason = entry.used_by
    module = _import(entry.module, modules)
    if isinstance(module, Exception):
        return [f"{entry.target}: module {entry.module} cannot be imported "
                f"({type(module).__name__}: {module}) ({reason})"]
    obj = module
    for part in entry.name.split("."):
        if not hasattr(obj, part):
            return [f"{entry.module} has no {entry.name} ({reason})"]
        obj = getattr(obj, part)
    problems = []
    if entry.fields:
        names = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else None
        if names is None:
            problems.append(f"{entry.target} is not a dataclass; expected fields {', '.join(entry.fields)} "
                            f"({reason})")
        else:
            problems += [f"{entry.target} has no field {name} ({reason})" for name in entry.fields
                         if name not in names]
    if entry.parameters:
        parameters = _parameters(obj)
        problems += [f"{entry.target} has no parameter {name} ({reason})" for name in entry.parameters
                     if parameters is not None and name not in parameters]
    if entry.assigns:
        source = _init_source(obj)
        problems += [f"{entry.target}.__init__ does not set self.{name} ({reason})" for name in entry.assigns
                     if source is not None and not _sets(source, name)]
    problems += [f"{entry.target} has no attribute {name} ({reason})" for name in entry.attributes
                 if not hasattr(obj, name)]
    return problems


def _import(name: str, modules: dict[str, Any]) -> Any:
    if name not in modules:
        try:
            modules[name] = importlib.import_module(name)
        except Exception as error:  # a module that fails on import is as missing as an absent one
            modules[name] = error
    return modules[name]


def _parameters(obj: Any) -> set[str] | None:
    """Names of obj's parameters; None when it takes **kwargs (any keyword passes) or has no signature."""
    try:
        parameters = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return None
    return set(parameters)


def _sets(source: str, name: str) -> bool:
    """`self.name = ...`, or a register_buffer/register_parameter call naming it."""
    return f"self.{name}" in source or f'"{name}"' in source or f"'{name}'" in source


def _init_source(cls: Any) -> str | None:
    try:
        return inspect.getsource(cls.__init__)
    except (OSError, TypeError):
        return None  # no source to read (a compiled build): nothing to check


def installed_torchtitan() -> str:
    """The torchtitan that `import torchtitan` finds, by its distribution's version; a source tree ahead of the
    installed distribution on the path (PYTHONPATH) is named by its folder instead."""
    import importlib.util
    from importlib.metadata import PackageNotFoundError, distribution

    spec = importlib.util.find_spec("torchtitan")  # finds, does not import
    imported = Path(spec.origin).resolve().parent if spec and spec.origin else None
    try:
        found = distribution("torchtitan")
    except PackageNotFoundError:
        found = None
    if found is not None and (imported is None or Path(found.locate_file("torchtitan")).resolve() == imported):
        return f"torchtitan {found.version}"
    return f"torchtitan from {imported.parent}, no distribution metadata" if imported else "no torchtitan"
