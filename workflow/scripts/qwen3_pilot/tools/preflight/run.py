"""The whole preflight: each check run and recorded (a failure is reported and the others still run), the report
written and summed up."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from ...parse_time.config import check_renamed_keys, deep_update, resolve_config
from ...paths import PROJECT, RunFolder
from ...problems import problem_list
from ...recipe_registry import RECIPES
from . import PUBLISHED_COMPONENTS, PreflightError
from .fork import UPSTREAM_TORCHTITAN, fork_check, fork_launches
from .launches import launch_plan
from .recipe_checks import (
    MOE_MODEL,
    checkpoint_stand_in,
    hf_check,
    moe_check,
    native_check,
    published_config,
    stage_recipes,
)


def load_config(configfiles: list[Path], project: Path = PROJECT) -> dict[str, Any]:
    """config/config.yaml, then each file laid over it key by key (Snakemake's --configfile), validated
    with the workflow's schema and cross-key rules."""
    from snakemake.utils import validate

    config = yaml.safe_load((project / "config" / "config.yaml").read_text())
    for path in configfiles:
        overlay = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(overlay, dict):
            raise PreflightError(f"{path}: expected a mapping of config keys, got {type(overlay).__name__}")
        config = deep_update(config, overlay)
    check_renamed_keys(config)
    validate(config, schema=str(project / "workflow" / "schemas" / "config.schema.yaml"))
    resolve_config(config)
    if config["backend"] != "neuron":
        raise PreflightError(f"backend = {config['backend']!r}: the preflight checks a neuron (trn2) configuration")
    return config


# ---- the whole preflight ----


def run_check(name: str, function: Callable[[], Any], checks: dict[str, Any]) -> Any:
    started = time.perf_counter()
    try:
        figures = function()
        checks[name] = {"status": "pass", "figures": figures}
        return figures
    except Exception as error:  # every check's failure is reported, then the preflight exits non-zero
        checks[name] = {"status": "fail", "error": f"{type(error).__name__}: {error}",
                        "traceback": traceback.format_exc(limit=4)}
        return None
    finally:
        checks[name]["seconds"] = round(time.perf_counter() - started, 2)


def not_run(name: str, reason: str, checks: dict[str, Any]) -> None:
    """A check that could not run because another one failed: its record says which, with no traceback."""
    checks[name] = {"status": "not_run", "error": f"not run: {reason}", "seconds": 0.0}


def preflight(configfiles: list[Path], model_configs: Path, out: Path, project: Path = PROJECT,
              fork: str | None = None, fork_ref: str | None = None,
              upstream: str = UPSTREAM_TORCHTITAN, cpu_run: Path = PROJECT) -> dict[str, Any]:
    """Runs every check (each one's failure is recorded, the others still run) and writes the report. With
    `fork`, the fork's own torchtitan is checked too (fork_check), at `fork_ref` or the release's ref, and it trains
    each recipe's recorded launch of the finished cpu run in `cpu_run` (fork_launches)."""
    from ...backends import make_backend
    from ...titan import api_names, titan_api

    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    checks: dict[str, Any] = {}
    config = run_check("config", lambda: load_config(configfiles, project), checks)
    if config is not None:
        checks["config"]["figures"] = {
            "files": [str(p) for p in configfiles], "backend": config["backend"], "ranks": config["ranks"],
            "nodes": config["nodes"],
            "neuron": config["neuron"], "training.seq_len": config["training"]["seq_len"],
            "weights": f"{config['weights']['repo_id']}@{config['weights']['revision']}",
            "kernels": {recipe.stage: config["kernels"].get(recipe.stage, []) for recipe in RECIPES},
        }
    run_check("install_plan", lambda: install_plan(project, config["neuron"]["sdk"]), checks)
    # The neuron backend's entries, read at call time (a test takes one away to see the check fail).
    run_check("torchtitan_api", lambda: torchtitan_api(api_names.TORCHTITAN_API), checks)
    # A torchtitan from before the config refactor builds no recipe and no plan: the checks that would build
    # one say so instead of each failing with its own traceback.
    titan_refused = titan_api.config_api_problem() is not None

    def titan_check(name: str, function: Callable[[], Any]) -> None:
        if titan_refused:
            not_run(name, "the installed torchtitan is refused (see torchtitan_api)", checks)
        else:
            run_check(name, function, checks)

    if config is not None:
        backend = make_backend(config, str(RunFolder(project).cache.resolve()))
        dense_json = run_check(
            "published_configs",
            lambda: {"dense": str(published_config(model_configs, config["weights"]["repo_id"].split("/")[-1])),
                     "moe": str(published_config(model_configs, MOE_MODEL))},
            checks,
        )
        if dense_json is not None:
            checkpoint = checkpoint_stand_in(work, Path(dense_json["dense"]))
            recipes = stage_recipes(config, backend, checkpoint, work)
            reasons = config["training"]["accepted_differences"]
            native_reasons = reasons.get("train_native", {})
            titan_check("train_native", lambda: native_check(recipes["train_native"], native_reasons))
            titan_check("train_hf", lambda: hf_check(recipes["train_hf"], reasons.get("train_hf", {})))
            titan_check("moe_reduced", lambda: moe_check(recipes["moe_reduced"], config, Path(dense_json["moe"])))
            run_check("launches", lambda: launch_plan(config, backend, project, configfiles), checks)
        titan_check("fsdp_plan", lambda: fsdp_plan(config, out))
    if fork is not None:
        def checked_fork() -> dict[str, Any]:
            from ...backends.neuron.stack import read_release

            ref = fork_ref or read_release(config["neuron"]["sdk"], project).fork.ref
            return fork_check(fork, ref, upstream, work)

        work.mkdir(parents=True, exist_ok=True)
        run_check("fork", checked_fork, checks)
        if checks["fork"]["status"] == "pass":
            run_check("fork_launches", lambda: fork_launches(work / "fork", cpu_run, work / "fork-launches"), checks)
        else:
            not_run("fork_launches", "the fork's clone or its API check failed (see fork)", checks)
    failed = [name for name, check in checks.items() if check["status"] != "pass"]
    report = {
        "title": "trn2 preflight",
        "status": "fail" if failed else "pass",
        "failed": failed,
        "nothing_ran_on_trainium": (
            "Nothing in this preflight ran on Trainium: configs were built and counted on the meta device of "
            "this machine, and the launch commands were printed, not run."
        ),
        "does_not_prove": (
            "That the launches succeed on a trn2, that the NKI kernels compile or match PyTorch there, that the "
            "Neuron packages are installed, or any memory, speed or loss figure. The FSDP plan counts parameters, "
            "gradients and AdamW state only (no activations, no compiler workspace)."
        ),
        "seconds": round(time.perf_counter() - started, 1),
        "checks": checks,
    }
    from ...artifacts import write_json, write_text

    write_json(out / "preflight.json", report)
    write_text(out / "preflight.html", render_html(report))
    return report


def torchtitan_api(entries) -> dict[str, Any]:
    """The installed torchtitan's API per recipe (and per stage module) for the neuron backend: each user's
    missing names; fails naming them, after refusing a torchtitan from before the config refactor."""
    from ...titan.titan_api import TorchtitanApiError, config_api_problem, installed_torchtitan, missing_by_user

    refused = config_api_problem()
    if refused:
        raise TorchtitanApiError(refused)
    missing = missing_by_user("neuron", entries)
    if any(missing.values()):
        raise TorchtitanApiError(f"{installed_torchtitan()} lacks names these use:\n" + "\n".join(
            f"  {user}:\n" + "\n".join(f"    - {name}" for name in names) for user, names in missing.items() if names))
    return {"version": installed_torchtitan(), "entries_checked": len(entries),
            **{user: "every name present" for user in missing}}


def install_plan(project: Path, release: str, published: Path = PUBLISHED_COMPONENTS) -> dict[str, Any]:
    """The SDK release config neuron.sdk names: workflow/envs/neuron.txt pins none of its components and not the fork,
    and its file's versions match AWS's published component list where one is recorded
    (`published`/sdk-<release>-components.md); what is unrecorded is listed."""
    from ...backends.neuron.stack import PINS_FILE, UNRECORDED, components_problems, pin_problems, read_release
    from ...pins import read_pins

    stack = read_release(release, project)
    problems = pin_problems(stack, read_pins(project / PINS_FILE))
    listed = published / f"sdk-{stack.release}-components.md"
    if listed.is_file():
        problems += [f"{stack.path} against {listed}: {p}" for p in components_problems(stack, listed.read_text())]
    if problems:
        raise PreflightError(problem_list("the Neuron install plan does not match its SDK release", problems))
    return {"sdk_release": stack.release, "released": stack.released, "stack_file": stack.path,
            "fork": stack.fork.source, "fork_pinned_to_a_commit": stack.fork.pinned,
            "components": stack.components(),
            "unrecorded": [name for name, version in stack.components().items() if UNRECORDED in version],
            "dlami": stack.machine.dlami or UNRECORDED, "sources": list(stack.sources),
            "published_list": str(listed) if listed.is_file() else f"not found ({listed}): versions not compared"}


def fsdp_plan(config: dict[str, Any], out: Path) -> dict[str, Any]:
    from ...rank_plan import run_plan_subprocess

    plan = config["plan"]
    result = run_plan_subprocess(flavor=plan["flavor"], world_size=plan["world_size"],
                                 hbm_per_rank_gib=plan["hbm_per_rank_gib"], out_path=out / "work" / "plan.json")
    if not result["fits"]:
        raise PreflightError(f"the {plan['flavor']} FSDP plan needs {result['static_gib_per_rank']:.2f} GiB per rank; "
                             f"plan.hbm_per_rank_gib = {plan['hbm_per_rank_gib']}")
    return result


def render_html(report: dict[str, Any]) -> str:
    from ...pilot_report import environment

    return environment().get_template("preflight.html.j2").render(report=report)


def print_summary(report: dict[str, Any]) -> None:
    print(f"trn2 preflight: {report['status']} in {report['seconds']} s. {report['nothing_ran_on_trainium']}")
    for name, check in report["checks"].items():
        print(f"  {check['status']:4}  {name}" + (f": {check['error']}" if check["status"] != "pass" else ""))
    plan = report["checks"].get("install_plan", {}).get("figures")
    if plan:
        print(f"  install_plan: Neuron SDK {plan['sdk_release']} ({plan['stack_file']}), fork {plan['fork']}"
              + (f"; unrecorded in it: {', '.join(plan['unrecorded'])}" if plan["unrecorded"] else ""))
    forked = report["checks"].get("fork", {}).get("figures")
    if forked:
        base = (f"base {forked['merge_base'][:12]} of {forked['merge_base_date']} on {forked['upstream']} "
                f"({forked['fork_commits_since']} fork commits since, {forked['upstream_commits_since']} upstream)"
                if forked["merge_base"] else f"base unknown: {forked['why']}")
        print(f"  fork: {forked['fork']} @ {forked['ref']} = {forked['commit'][:12]}; {base}")
    trained = report["checks"].get("fork_launches", {}).get("figures")
    if trained:
        print(f"  fork_launches: {trained['torchtitan']} ({trained['level']} level), {trained['steps']} steps each: "
              + "; ".join(f"{name} {why}" for name, why in trained["recipes"].items()))
    elif "fork" not in report["checks"]:
        print("  fork: not checked (give --fork PATH_OR_URL: its base on upstream and its torchtitan's API)")
    native = report["checks"].get("train_native", {}).get("figures")
    if native:
        configured = native["kernel_replacements"].get("rope_hf", 0)
        print(f"  train_native: {native['parameters']:,} parameters, "
              f"rope_hf replaces {native['rope_hf_on_every_layer']} of {native['layers']} layers' RoPE; "
              + (f"{configured} rope_hf replacements in its planned launch (kernels.train_native), its plain "
                 "twin without them" if configured else "not in its planned launch (kernels.train_native is empty)"))
        print(f"  train_native starts from {native['base']} (parallelize_fn {native['parallelize_fn']}, "
              f"spmd_backend {native['spmd_backend']})")
        for row in native["parity"]:
            print(f"    {row['field']:24} built {row['built']!s:>12}  "
                  f"config.json {row['checkpoint']!s:>12}  {row['verdict']}")
    for launch in (report["checks"].get("launches", {}).get("figures") or []):
        env = " ".join(f"{key}={value}" for key, value in sorted(launch["env"].items()))
        print(f"  $ {launch['stage']} ({launch['launch']}): {env} {' '.join(launch['command'])}")
