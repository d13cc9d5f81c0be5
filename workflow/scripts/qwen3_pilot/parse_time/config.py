"""Checks on the configuration that a JSON schema cannot express, run at parse time after `validate()`."""

from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path
from typing import Any

from ..backends import backend_module
from ..backends.neuron.config_rules import hbm_per_rank_gib
from ..problems import problem_list
from ..recipe_registry import FROM_FETCHED_WEIGHTS_STAGES, RECIPES


class ConfigError(ValueError):
    pass


# Keys renamed so that every per-stage key is named by its stage (as kernels.<stage> is) and no two keys share a
# name for two things: the old name -> the new one. A config using an old name is refused with the new name,
# before the schema's generic "additional properties" error.
RENAMED_KEYS = {
    "training.accepted_differences.native": "training.accepted_differences.train_native",
    "training.accepted_differences.hf": "training.accepted_differences.train_hf",
    "training.gate.control_above_ln_vocab.native": "training.gate.control_above_ln_vocab.train_native",
    "training.gate.control_above_ln_vocab.hf": "training.gate.control_above_ln_vocab.train_hf",
    "kernel_numerics.train.loss_tolerance": "kernel_numerics.train.tiny_model_loss_tolerance",
    "benchmark.price_per_hour": "benchmark.price.per_hour (with its kind, region, as_of and source)",
    "benchmark.cost": "benchmark.price (the cost is shown whenever benchmark.price.per_hour is set)",
}


def renamed_key_problems(config: dict[str, Any]) -> list[str]:
    """Each old key name the config uses, with the name that replaced it."""
    problems = []
    for old, new in RENAMED_KEYS.items():
        *parents, leaf = old.split(".")
        section: Any = config
        for part in parents:
            section = section.get(part) if isinstance(section, dict) else None
        if isinstance(section, dict) and leaf in section:
            problems.append(f"{old}: renamed to {new}; rename it in your config file")
    return problems


def check_renamed_keys(config: dict[str, Any]) -> None:
    """Before `validate()`: old key names refused with their new ones."""
    problems = renamed_key_problems(config)
    if problems:
        raise ConfigError(problem_list("Invalid configuration", problems))


def config_problems(config: dict[str, Any]) -> list[str]:
    """Every cross-key rule the config breaks, each naming the key, the value and what is allowed."""
    problems = []
    training = config["training"]

    per_step = training["local_batch_size"] * config["ranks"] * config["nodes"]
    if training["global_batch_size"] % per_step:
        problems.append(
            f"training.global_batch_size = {training['global_batch_size']}: must be a multiple of "
            f"training.local_batch_size x ranks x nodes = {training['local_batch_size']} x {config['ranks']} x "
            f"{config['nodes']} = {per_step}"
        )

    fixture = config["fixture"]
    if fixture["num_attention_heads"] % fixture["num_key_value_heads"]:
        problems.append(
            f"fixture.num_key_value_heads = {fixture['num_key_value_heads']}: must divide "
            f"fixture.num_attention_heads = {fixture['num_attention_heads']} (grouped-query attention)"
        )
    bench = config["benchmark"]
    price = bench["price"]
    if price["per_hour"] is not None:
        unsaid = [key for key in ("kind", "region", "as_of", "source") if price[key] is None]
        if unsaid:
            problems.append(f"benchmark.price.per_hour = {price['per_hour']}: also set benchmark.price."
                            + ", benchmark.price.".join(unsaid) + " (which price it is, where, when, and from where)")
    outside = [r for r in bench["compile_recipes"] if r not in bench["recipes"]]
    if outside:
        problems.append(f"benchmark.compile_recipes = {bench['compile_recipes']}: {', '.join(outside)} not in "
                        f"benchmark.recipes = {bench['recipes']}")
    convergence = config["convergence"]
    if convergence["eval_every"] > convergence["steps"]:
        problems.append(f"convergence.eval_every = {convergence['eval_every']} is more than convergence.steps = "
                        f"{convergence['steps']}: the held-out loss would be measured once, after step 1, with "
                        "nothing to fall from")
    baseline = config["report"]["baseline"]
    if baseline:
        problems.extend(baseline_problems(Path(baseline), config["backend"]))
    # The configured backend's own rules (backends/<backend>: what its devices, kernels and compiler take).
    return problems + backend_module(config["backend"]).config_problems(config)


def baseline_problems(path: Path, backend: str) -> list[str]:
    """A configured baseline must be a report.json this workflow wrote (relative paths: the workflow's), of a
    run on the same backend: a CPU rehearsal's figures say nothing about a trn2 run's."""
    where = f"report.baseline = {str(path)!r}"
    if not path.is_file():
        return [f"{where}: no such file (expected a results/report.json of an earlier run)"]
    try:
        baseline = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return [f"{where}: not readable as JSON ({error})"]
    missing = [key for key in ("stages", "provenance", "environment")
               if not isinstance(baseline, dict) or key not in baseline]
    if missing:
        return [f"{where}: not a pilot report.json (no {', '.join(missing)})"]
    if baseline.get("backend") != backend:
        return [f"{where}: a report of the {baseline.get('backend')} backend; this run is on {backend}, and a run is "
                "compared only with a run of its own backend"]
    return []


def fill_derived(config: dict[str, Any]) -> dict[str, Any]:
    """After `validate()`: the keys whose null means "derived from other keys". training.global_batch_size
    = null is one sequence per rank per step (local batch x ranks x nodes), so a config keeps working when
    `nodes` changes; plan.hbm_per_rank_gib = null is a trn2 rank's share of a chip's HBM (the plan is of the trn2
    target on every backend, so the neuron backend's topology answers)."""
    training = config["training"]
    if training["global_batch_size"] is None:
        training["global_batch_size"] = training["local_batch_size"] * config["ranks"] * config["nodes"]
    if config["plan"]["hbm_per_rank_gib"] is None:
        config["plan"]["hbm_per_rank_gib"] = hbm_per_rank_gib(config["neuron"])
    return config


def resolve_config(config: dict[str, Any]) -> dict[str, Any]:
    """After `validate()`: the derived keys filled in, then the cross-key rules checked."""
    check_config(fill_derived(config))
    return config


def check_config(config: dict[str, Any]) -> None:
    problems = config_problems(config)
    if problems:
        raise ConfigError(problem_list("Invalid configuration", problems))


def is_pinned_revision(revision: str) -> bool:
    """A 40-hex commit pins the download; a branch or tag name can move under the same config."""
    return re.fullmatch(r"[0-9a-f]{40}", revision) is not None


# What every trainer run reads of config `training` (training.trainer_run).
TRAINER_KEYS = ("steps", "seq_len", "local_batch_size", "global_batch_size", "seed", "lr", "warmup_steps",
                "mixed_precision_param", "export_dtype", "attention", "comm_init_timeout_s", "comm_train_timeout_s")
# The stages that measure and leave their judging to rule judge (measured.json -> summary.json): a threshold,
# tolerance or reason edit re-judges their figures without training or measuring again.
JUDGED_STAGES = ("verify_ranks", "train_hf", "train_native", "convergence", "moe_reduced", "export_reload",
                 "kernel_numerics", "benchmark")
# The keys of a measuring stage's own config section that only its judge reads: the measuring rule's params
# leave them out (stage_measuring), the judge's hold them (stage_judging).
JUDGING_KEYS: dict[str, tuple[tuple[str, ...], ...]] = {
    "verify_ranks": (("floor",),),
    "convergence": (("min_fall",), ("max_spike_ratio",)),
    "export_reload": (("logits_tolerance",), ("min_argmax_agreement",)),
    "kernel_numerics": (("rope", "tolerances"), ("moe", "tolerances"), ("train", "tiny_model_loss_tolerance"),
                        ("compile", "tolerances")),
    "benchmark": (("noisy_cv",), ("price",), ("budget",)),
}


def key_sorted(value: Any) -> Any:
    """`value` with every mapping's keys in sorted order. Snakemake compares a rule's params with the recorded ones
    as written, key order included, and a --configfile overlay moves the keys it sets to the front of their
    section: params taken from a section would look changed after an edit to a key they leave out."""
    if isinstance(value, dict):
        return {key: key_sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [key_sorted(item) for item in value]
    return value


def stage_training(config: dict[str, Any], *stages: str) -> dict[str, Any]:
    """The part of config `training` that the trainer runs of `stages` read, as a rule's params: every trainer's
    keys, native_flavor only for the native recipe, and the names of each recipe's accepted differences (the
    ranks refuse any other difference before they train; the reasons are the judge's, stage_judging). A rule
    that took the whole section would rerun on an edit to another recipe's settings or to any threshold."""
    training = config["training"]
    part: dict[str, Any] = {key: training[key] for key in TRAINER_KEYS}
    if "train_native" in stages:
        part["native_flavor"] = training["native_flavor"]
    part["accepted_differences"] = {k: sorted(v) for k, v in training["accepted_differences"].items() if k in stages}
    return key_sorted(part)


# The training settings stage fail_fast sets itself in its tiny launches (stages/fail_fast.tiny_training): left out
# of its params, so that an edit to one of them reruns the stages that use it and not fail_fast. Its launches ask
# whether each recipe runs at all: the learning rate and the seed decide nothing of that.
FAIL_FAST_OWN_KEYS = ("steps", "seq_len", "local_batch_size", "global_batch_size", "warmup_steps", "native_flavor",
                      "lr", "seed")


def fail_fast_training(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each recipe's training settings as fail_fast reads them (stage_training, less what it sets itself)."""
    return {recipe.stage: {key: value for key, value in stage_training(config, recipe.stage).items()
                           if key not in FAIL_FAST_OWN_KEYS} for recipe in RECIPES}


def stage_repeat_steps(config: dict[str, Any], stage: str) -> int:
    """How many steps of `stage`'s random-init control are launched twice (config training.repeat); 0: not repeated,
    and the control runs its one step."""
    repeat = config["training"]["repeat"]
    return repeat["steps"] if stage in repeat["recipes"] else 0


def split_by_judging_keys(config: dict[str, Any], stage: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Config section `stage` in two halves: without the keys its judge reads (JUDGING_KEYS), and those keys
    alone, nested as in the config; each key-sorted."""
    measuring: dict[str, Any] = copy.deepcopy(config[stage])
    judging: dict[str, Any] = {}
    for *parents, leaf in JUDGING_KEYS[stage]:
        source, target = measuring, judging
        for part in parents:
            source, target = source[part], target.setdefault(part, {})
        target[leaf] = source.pop(leaf)
    return key_sorted(measuring), key_sorted(judging)


def stage_measuring(config: dict[str, Any], stage: str) -> dict[str, Any]:
    """Config section `stage` without the keys its judge reads (JUDGING_KEYS), as the measuring rule's params."""
    return split_by_judging_keys(config, stage)[0]


def stage_judging(config: dict[str, Any], stage: str) -> dict[str, Any]:
    """What rule judge holds one stage's measured figures to, as its params. For a training stage: the loaded-weights
    gate with this recipe's control band (FROM_FETCHED_WEIGHTS_STAGES), the reasons of its accepted differences, the
    repeated control's loss tolerance where training.repeat lists it, and kernels.loss_tolerance where the stage
    replaces kernels (its replaced run against the plain one). For verify_ranks, export_reload, kernel_numerics and
    the benchmark: their sections' JUDGING_KEYS, nested as in the config."""
    if stage in JUDGING_KEYS:
        return split_by_judging_keys(config, stage)[1]
    judging: dict[str, Any] = {}
    if stage in FROM_FETCHED_WEIGHTS_STAGES:
        gate = config["training"]["gate"]
        judging["gate"] = {**gate, "control_above_ln_vocab": gate["control_above_ln_vocab"][stage]}
        judging["accepted_differences"] = config["training"]["accepted_differences"].get(stage, {})
        if stage_repeat_steps(config, stage):
            judging["repeat_loss_tolerance"] = config["training"]["repeat"]["loss_tolerance"]
    if stage_kernel_rules(config, stage):
        judging["loss_tolerance"] = config["kernels"]["loss_tolerance"]
    return key_sorted(judging)


def stage_kernel_rules(config: dict[str, Any], stage: str) -> list[dict[str, str]]:
    """The kernel replacements a training stage builds its model with ({kernel, layers, module} each), from
    config `kernels`: the list under the stage's name, each kernel's rule from `kernels.rules`."""
    kernels = config["kernels"]
    return [{"kernel": name, **kernels["rules"][name]} for name in kernels.get(stage, [])]


def deep_update(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """`base` with `overlay` laid over it key by key (nested mappings merged, anything else replaced), as
    Snakemake lays one --configfile over another; neither argument is changed."""
    out = copy.deepcopy(base)
    for key, value in overlay.items():
        nested = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = deep_update(out[key], value) if nested else value
    return out


def config_digest(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()
