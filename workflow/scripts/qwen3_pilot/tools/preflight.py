"""The trn2 preflight: everything about a trn2 configuration that can be checked without a trn2, on any
machine, before anyone rents one.

    python -m qwen3_pilot.tools.preflight --configfile config/trn2.yaml [--model-configs DIR] [--out DIR]
    (make preflight)

1. the config: config/config.yaml with the given files laid over it, validated against the schema and the
   cross-key rules, exactly as the Snakefile does;
2. torchtitan's API: every class, field and function the recipes use exists (titan_api);
3. every recipe's full torchtitan config, built by the recipes' own config functions from the published
   models' config.json values (`--model-configs`: <repo name>.config.json for weights.repo_id, and
   Qwen3-30B-A3B.config.json for the reduced MoE's widths): config parity, the kernel converters and their
   replacement counts (rope_hf on the native 4B model as well, configured or not), parameter counts on
   the meta device;
4. the 64-rank FSDP plan of the 4B model (memory per rank, torchtitan's fake process group);
5. the exact launch command and environment of every neuron stage that uses the device;
6. with `--fork PATH_OR_URL`: the TorchTitan Neuron clone at the release's ref (or `--fork-ref`), its merge-base
   with upstream torchtitan (`--upstream`, fetched into a scratch clone) and that commit's date where the
   histories allow, the API check of step 2 against the fork's own torchtitan, in a fresh interpreter, and each
   recipe's launch of the finished cpu run in `--cpu-run` (default: here, after `make report`) again for 2 steps
   with the fork's torchtitan (tools/fork.py).

It writes preflight.json and preflight.html into `--out` and exits non-zero when a check failed. Nothing
here runs on Trainium, and the report says so.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from ..parse_time.config import (
    check_renamed_keys,
    deep_update,
    resolve_config,
    stage_kernel_rules,
    stage_repeat_steps,
    stage_training,
)
from ..paths import PROJECT, WORKFLOW, RunFolder
from ..problems import problem_list
from ..recipe_registry import RECIPES, recipe_of
from .fork import UPSTREAM_TORCHTITAN, fork_check, fork_launches

RESOURCES = WORKFLOW / "resources"
# The published models' config.json values, and AWS's component list per SDK release
# (sdk-<release>-components.md): each folder's README says where they come from.
DEFAULT_MODEL_CONFIGS = RESOURCES / "qwen3-configs"
PUBLISHED_COMPONENTS = RESOURCES / "neuron"
MOE_MODEL = "Qwen3-30B-A3B"
# The reduced MoE's widths against Qwen3-30B-A3B's config.json: moe.full_width key -> config.json key.
MOE_WIDTH_FIELDS = {
    "dim": "hidden_size", "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim", "moe_hidden_dim": "moe_intermediate_size", "vocab_size": "vocab_size",
    "layers": "num_hidden_layers", "experts": "num_experts",
}


class PreflightError(RuntimeError):
    pass


# ---- 1. config ----


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


# ---- 3. recipes ----


def published_config(model_configs: Path, name: str) -> Path:
    path = Path(model_configs) / f"{name}.config.json"
    if not path.exists():
        raise PreflightError(f"{path}: no published config.json for {name} (--model-configs names the folder)")
    return path


def checkpoint_stand_in(work: Path, config_json: Path) -> Path:
    """A folder holding only the published config.json: what the recipes read of the fetched checkpoint
    when they build a config (the weights and tokenizer are read by the trainer, which does not run here)."""
    folder = work / "checkpoint"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(config_json.read_text())
    return folder


def stage_recipes(config: dict[str, Any], backend, checkpoint: Path, work: Path) -> dict[str, Path]:
    """The TrainerRun each neuron training stage would write, with the trn2 config's values."""
    from ..reduced_moe import model_spec, reduced_moe_changes
    from ..titan.parity import read_checkpoint_values
    from ..trainer_run import PARITY_FILE, ROUTER_LOAD_FILE
    from ..training import trainer_run

    peak = backend.peak_flops_per_rank
    paths = {}
    for stage in (recipe.stage for recipe in RECIPES):
        folder = work / stage
        folder.mkdir(parents=True, exist_ok=True)
        trainer = trainer_run(
            stage=stage, backend=backend, checkpoint=checkpoint, corpus_dir=work / "corpus",
            dataset=config["data"]["dataset"], training=stage_training(config, stage), peak_flops_per_rank=peak,
            parity_path=folder / PARITY_FILE, replacements=stage_kernel_rules(config, stage),
            lnc=config["neuron"]["lnc"],
        )
        if stage == "moe_reduced":
            vocab = read_checkpoint_values(checkpoint)["vocab_size"]
            spec = model_spec(config["moe"], config["moe"]["width"], vocab, config["training"]["seq_len"])
            trainer = trainer.replace(**reduced_moe_changes(spec, folder / "run" / ROUTER_LOAD_FILE))
        paths[stage] = folder / "recipe.json"
        trainer.write(paths[stage])
    return paths


def build_recipe(recipe_path: Path, config_function: str):
    """The recipe's torchtitan Trainer.Config, from the recipes' own config function."""
    from ..titan.in_ranks import recipes
    from ..trainer_run import RECIPE_ENV

    previous = os.environ.get(RECIPE_ENV)
    os.environ[RECIPE_ENV] = str(recipe_path)
    try:
        return getattr(recipes, config_function)()
    finally:
        if previous is None:
            os.environ.pop(RECIPE_ENV, None)
        else:
            os.environ[RECIPE_ENV] = previous


def native_check(recipe_path: Path, lnc: int, reasons: dict[str, str]) -> dict[str, Any]:
    """The native recipe's config as its trainer builds it: parity against config.json (each accepted difference
    with its `reasons` entry), its kernel replacements and parameter count."""
    from ..titan.in_ranks.recipes import taken_from_base
    from ..titan.models import count_parameters
    from ..titan.parity import with_reasons
    from ..titan.replacement import apply_converters, kernel_converters, replaced_paths

    trainer = build_recipe(recipe_path, "qwen3_native")
    model = trainer.model_spec.model
    parity = json.loads(recipe_path.with_name("parity.json").read_text())
    configured = replaced_paths(model)
    # The seed's custom-replacement demonstration: RoPE replaced in every layer of the 4B model. Checked
    # here whether or not kernels.train_native turns it on, so that turning it on is known to work.
    demo = configured if "rope_hf" in configured else replaced_paths(
        apply_converters(copy.deepcopy(model), kernel_converters([{"kernel": "rope_hf", "layers": "*"}], lnc))
    )
    if len(demo.get("rope_hf", [])) != len(model.layers):
        raise PreflightError(f"train_native: rope_hf replaced {len(demo.get('rope_hf', []))} RoPE modules in a "
                             f"{len(model.layers)}-layer model; expected one per layer")
    from ..titan.titan_api import native_base

    return {
        # Which config function the recipe started from on neuron: the fork's Qwen3 recipe where it has one.
        "base": native_base("neuron")[1],
        "flavor": trainer.model_spec.flavor,
        "parameters": count_parameters(model),
        "layers": len(model.layers),
        "parity": with_reasons(parity["rows"], reasons),
        "kernel_replacements": _counts(configured),
        "rope_hf_on_every_layer": len(demo.get("rope_hf", [])),
        "seq_len": trainer.training.seq_len,
        "global_batch_size": trainer.training.global_batch_size,
        "mixed_precision_param": trainer.training.mixed_precision_param,
        # torchtitan's collective timeouts as the trainer gets them: to the end of step 1, and after (the export).
        "comm_timeouts_s": {"init": trainer.comm.init_timeout_seconds, "train": trainer.comm.train_timeout_seconds},
        **taken_from_base(trainer),
    }


def hf_check(recipe_path: Path, reasons: dict[str, str]) -> dict[str, Any]:
    """The transformers-backend recipe: its config, and parity of the transformers config it builds the
    model from (torchtitan's own update_from_config, as the trainer calls it) against config.json, each accepted
    difference with its `reasons` entry."""
    from ..titan.models import hf_model_values
    from ..titan.parity import parity_table, read_checkpoint_values
    from ..trainer_run import TrainerRun

    trainer = build_recipe(recipe_path, "qwen3_hf")
    recipe = TrainerRun.read(recipe_path)
    model_config = copy.deepcopy(trainer.model_spec.model)
    model_config.update_from_config(config=trainer)
    hf = read_checkpoint_values(Path(recipe.checkpoint))
    accepted = {field: reasons[field] for field in recipe.accepted_differences}
    rows, problems = parity_table(hf_model_values(model_config), hf, accepted)
    if problems:
        raise PreflightError(problem_list("train_hf: the model differs from config.json", problems))
    return {"hf_model": trainer.hf_model, "parity": rows, "seq_len": trainer.training.seq_len}


def moe_check(recipe_path: Path, config: dict[str, Any], moe_config_json: Path) -> dict[str, Any]:
    from ..titan.in_ranks.recipes import taken_from_base
    from ..titan.models import count_parameters
    from ..titan.parity import _same
    from ..titan.replacement import replaced_paths

    trainer = build_recipe(recipe_path, "qwen3_moe_reduced")
    model = trainer.model_spec.model
    parameters = count_parameters(model)
    expected = config["moe"]["full_width"]["expected_params"]
    published = json.loads(moe_config_json.read_text())
    full = config["moe"]["full_width"]
    rows = [{"field": key, "moe.full_width": full[key], f"{MOE_MODEL} config.json": published.get(hf_key),
             "verdict": "match" if _same(full[key], published.get(hf_key)) else "MISMATCH"}
            for key, hf_key in MOE_WIDTH_FIELDS.items()]
    problems = [f"moe.full_width.{row['field']} = {row['moe.full_width']}, {MOE_MODEL} config.json has "
                f"{row[f'{MOE_MODEL} config.json']}" for row in rows if row["verdict"] != "match"]
    width = config["moe"]["width"]
    trained_at_full = all(width[key] == full[key] for key in width)
    if trained_at_full and parameters != expected:
        problems.append(f"the reduced MoE built from the trn2 config has {parameters:,} parameters; "
                        f"moe.full_width.expected_params = {expected:,}")
    if trainer.compile.enable:
        problems.append("torch.compile is on; the seed's reduced-MoE configuration is eager")
    replaced = _counts(replaced_paths(model))
    for rule in stage_kernel_rules(config, "moe_reduced"):
        if replaced.get(rule["kernel"]) != len(model.layers):
            problems.append(f"{rule['kernel']} replaced {replaced.get(rule['kernel'], 0)} modules in a "
                            f"{len(model.layers)}-layer model; kernels.rules.{rule['kernel']} targets "
                            f"layers {rule['layers']!r}")
    if problems:
        raise PreflightError(problem_list("moe_reduced", problems))
    return {
        "parameters": parameters,
        "trained_at_full_width": trained_at_full,
        "layers": len(model.layers),
        "widths_against_published": rows,
        "kernel_replacements": replaced,
        "compile": trainer.compile.enable,
        **taken_from_base(trainer),
    }


def _counts(paths: dict[str, list[str]]) -> dict[str, int]:
    return {kernel: len(found) for kernel, found in paths.items()}


# ---- 5. launch commands ----


def launch_plan(config: dict[str, Any], backend, project: Path, configfiles: list[Path]) -> list[dict[str, Any]]:
    """The command and added environment of every neuron stage that uses the device: each torchrun launch,
    built by the same functions the stages launch with, at the paths the workflow gives them, and
    kernel_numerics, which uses the device in the stage's own process (its command: the Snakemake run of that
    stage alone, with the configuration files the preflight checked). Refused, naming each, where this
    environment would break the launches (a preset NEURON_RT_VISIBLE_CORES, an LNC in NEURON_CC_FLAGS that is
    not neuron.lnc)."""
    from ..backends.neuron import launch_environment_problems
    from ..ranks import rank_worker_command
    from ..training import (
        CONTROL_RECIPE,
        PLAIN_CHANGES,
        PLAIN_RECIPE,
        control_changes,
        trainer_launch,
    )

    problems = launch_environment_problems(config)
    if problems:
        raise PreflightError(problem_list("the launching environment", problems))

    python, results, logs = sys.executable, project / "results", project / "logs"
    launches = [{
        "stage": "verify_ranks", "launch": "ranks",
        "command": rank_worker_command(backend, backend.ranks_per_node, results / "verify_ranks" / "ranks", python,
                                       backend.rank_log_dir(logs / "verify_ranks" / "verify_ranks.log", "ranks"),
                                       config["verify_ranks"]["collectives"]),
        "env": backend.launcher_env,
    }, {
        # Snakemake runs the stage's script in one process on one node, which sets this environment itself
        # (stages/kernel_numerics/) before it loads the kernels; the script reads its settings from Snakemake,
        # so the command a person can run is the stage's own target (after its pin_env stamps).
        "stage": "kernel_numerics", "launch": "stage process (no torchrun)",
        "command": ["snakemake", "--cores", "1", *(arg for path in configfiles for arg in ("--configfile", str(path))),
                    "results/kernel_numerics/measured.json"],
        "env": backend.device_process_env,
    }]
    # What each launch changes in the stage's own recipe (every setting reaches the ranks in its TrainerRun file).
    for recipe in RECIPES:
        stage = recipe.stage
        kinds = [("run", "recipe.json", {})]
        if recipe.from_fetched_weights:
            repeat_steps = stage_repeat_steps(config, stage)
            kinds.append(("control", CONTROL_RECIPE, control_changes(repeat_steps)))
            if repeat_steps:  # the same control again (training.repeat)
                kinds.append(("repeat", CONTROL_RECIPE, control_changes(repeat_steps)))
        if stage_kernel_rules(config, stage):
            kinds.append(("plain", PLAIN_RECIPE, PLAIN_CHANGES))
        for kind, recipe_file, settings in kinds:
            command, env = trainer_launch(
                backend, backend.ranks_per_node, recipe.config_function, results / stage / recipe_file,
                results / stage / kind, python, rank_log_dir=backend.rank_log_dir(logs / stage / f"{stage}.log", kind),
            )
            launches.append({"stage": stage, "launch": kind, "command": command, "env": env, "run": settings})
    launches += benchmark_launches(config, backend, results, logs)
    return launches


def benchmark_launches(config: dict[str, Any], backend, results: Path, logs: Path) -> list[dict[str, Any]]:
    """The benchmark stage's launches: per recipe and run, with the compile backend and the fresh compile
    cache folder of each measurement that compiles (the eager one too on neuron)."""
    from ..benchmark_runs import compile_cache_folder, run_changes, run_paths, variants
    from ..training import trainer_launch

    launches = []
    runs_dir = results / "benchmark" / "runs"
    for recipe in config["benchmark"]["recipes"]:
        rules = stage_kernel_rules(config, recipe)
        for variant, replaced, compile_backend in variants(recipe, rules, config["benchmark"], backend.compile_backend):
            recipe_path, run_dir, launch_name = run_paths(runs_dir, recipe, variant)
            cache = compile_cache_folder(run_dir.parent, variant, backend.eager_compiles)
            command, env = trainer_launch(
                backend, backend.ranks_per_node, recipe_of(recipe).config_function, recipe_path, run_dir,
                sys.executable, rank_log_dir=backend.rank_log_dir(logs / "benchmark" / "benchmark.log", launch_name),
                extra_env=backend.compile_cache_env(cache) if cache else None,
            )
            settings = {**run_changes(compile_backend), "replacements": replaced}
            launches.append({"stage": "benchmark", "launch": f"{recipe} {variant}", "command": command, "env": env,
                             "run": settings})
    return launches


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
    from ..backends import make_backend
    from ..titan import titan_api

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
    run_check("torchtitan_api", lambda: torchtitan_api(titan_api.TORCHTITAN_API), checks)
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
            lnc = config["neuron"]["lnc"]
            reasons = config["training"]["accepted_differences"]
            native_reasons = reasons.get("train_native", {})
            titan_check("train_native", lambda: native_check(recipes["train_native"], lnc, native_reasons))
            titan_check("train_hf", lambda: hf_check(recipes["train_hf"], reasons.get("train_hf", {})))
            titan_check("moe_reduced", lambda: moe_check(recipes["moe_reduced"], config, Path(dense_json["moe"])))
            run_check("launches", lambda: launch_plan(config, backend, project, configfiles), checks)
        titan_check("fsdp_plan", lambda: fsdp_plan(config, out))
    if fork is not None:
        def checked_fork() -> dict[str, Any]:
            from ..neuron_stack import read_release

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
    from ..artifacts import write_json, write_text

    write_json(out / "preflight.json", report)
    write_text(out / "preflight.html", render_html(report))
    return report


def torchtitan_api(entries) -> dict[str, Any]:
    """The installed torchtitan's API per recipe (and per stage module) for the neuron backend: each user's
    missing names; fails naming them, after refusing a torchtitan from before the config refactor."""
    from ..titan.titan_api import TorchtitanApiError, config_api_problem, installed_torchtitan, missing_by_user

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
    from ..neuron_stack import PINS_FILE, UNRECORDED, components_problems, pin_problems, read_release
    from ..pins import read_pins

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
    from ..rank_plan import run_plan_subprocess

    plan = config["plan"]
    result = run_plan_subprocess(flavor=plan["flavor"], world_size=plan["world_size"],
                                 hbm_per_rank_gib=plan["hbm_per_rank_gib"], out_path=out / "work" / "plan.json")
    if not result["fits"]:
        raise PreflightError(f"the {plan['flavor']} FSDP plan needs {result['static_gib_per_rank']:.2f} GiB per rank; "
                             f"plan.hbm_per_rank_gib = {plan['hbm_per_rank_gib']}")
    return result


def render_html(report: dict[str, Any]) -> str:
    from ..pilot_report import environment

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="trn2 preflight: the trn2 configuration checked without a trn2")
    parser.add_argument("--configfile", type=Path, nargs="+", default=[PROJECT / "config" / "trn2.yaml"])
    parser.add_argument("--model-configs", type=Path, default=DEFAULT_MODEL_CONFIGS,
                        help="folder with the published <model>.config.json files")
    parser.add_argument("--out", type=Path, default=RunFolder(PROJECT).results / "preflight")
    parser.add_argument("--fork", help="a TorchTitan Neuron clone (path or URL) to check: its base, its API and "
                                       "the recipes' launches on its torchtitan")
    parser.add_argument("--fork-ref", help="the fork's branch, tag or commit (default: the SDK release file's ref)")
    parser.add_argument("--upstream", default=UPSTREAM_TORCHTITAN, help="upstream torchtitan (path or URL)")
    parser.add_argument("--cpu-run", type=Path, default=PROJECT,
                        help="a finished cpu run whose recipe launches the fork's torchtitan trains (default: here)")
    args = parser.parse_args(argv)
    report = preflight(args.configfile, args.model_configs, args.out, fork=args.fork, fork_ref=args.fork_ref,
                       upstream=args.upstream, cpu_run=args.cpu_run.resolve())
    print_summary(report)
    print(f"report: {args.out / 'preflight.html'}")
    return 0 if report["status"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
