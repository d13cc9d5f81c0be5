"""The preflight's recipe checks (its step 3): every recipe's full torchtitan config, built by the recipes' own
config functions from the published models' config.json values, with config parity, the kernel converters and
their replacement counts, and parameter counts on the meta device."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

from ...parse_time.config import stage_kernel_rules, stage_training
from ...problems import problem_list
from ...recipe_registry import RECIPES
from . import PreflightError

MOE_MODEL = "Qwen3-30B-A3B"
# The reduced MoE's widths against Qwen3-30B-A3B's config.json: moe.full_width key -> config.json key.
MOE_WIDTH_FIELDS = {
    "dim": "hidden_size", "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim", "moe_hidden_dim": "moe_intermediate_size", "vocab_size": "vocab_size",
    "layers": "num_hidden_layers", "experts": "num_experts",
}


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
    from ...reduced_moe import model_spec, reduced_moe_changes
    from ...titan.parity import read_checkpoint_values
    from ...trainer_run import PARITY_FILE, ROUTER_LOAD_FILE
    from ...training import trainer_run

    peak = backend.peak_flops_per_rank
    paths = {}
    for stage in (recipe.stage for recipe in RECIPES):
        folder = work / stage
        folder.mkdir(parents=True, exist_ok=True)
        trainer = trainer_run(
            stage=stage, backend=backend, checkpoint=checkpoint, corpus_dir=work / "corpus",
            dataset=config["data"]["dataset"], training=stage_training(config, stage), peak_flops_per_rank=peak,
            parity_path=folder / PARITY_FILE, replacements=stage_kernel_rules(config, stage),
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
    from ...titan.in_ranks import recipes
    from ...trainer_run import RECIPE_ENV

    previous = os.environ.get(RECIPE_ENV)
    os.environ[RECIPE_ENV] = str(recipe_path)
    try:
        return getattr(recipes, config_function)()
    finally:
        if previous is None:
            os.environ.pop(RECIPE_ENV, None)
        else:
            os.environ[RECIPE_ENV] = previous


def native_check(recipe_path: Path, reasons: dict[str, str]) -> dict[str, Any]:
    """The native recipe's config as its trainer builds it: parity against config.json (each accepted difference
    with its `reasons` entry), its kernel replacements and parameter count."""
    from ...titan.in_ranks.recipes import taken_from_base
    from ...titan.models import count_parameters
    from ...titan.parity import with_reasons
    from ...titan.replacement import apply_converters, kernel_converters, replaced_paths

    trainer = build_recipe(recipe_path, "qwen3_native")
    model = trainer.model_spec.model
    parity = json.loads(recipe_path.with_name("parity.json").read_text())
    configured = replaced_paths(model)
    # The seed's custom-replacement demonstration: RoPE replaced in every layer of the 4B model. Checked
    # here whether or not kernels.train_native turns it on, so that turning it on is known to work.
    demo = configured if "rope_hf" in configured else replaced_paths(
        apply_converters(copy.deepcopy(model), kernel_converters([{"kernel": "rope_hf", "layers": "*"}]))
    )
    if len(demo.get("rope_hf", [])) != len(model.layers):
        raise PreflightError(f"train_native: rope_hf replaced {len(demo.get('rope_hf', []))} RoPE modules in a "
                             f"{len(model.layers)}-layer model; expected one per layer")
    from ...titan.titan_api import native_base

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
    from ...titan.models import hf_model_values
    from ...titan.parity import parity_table, read_checkpoint_values
    from ...trainer_run import TrainerRun

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
    from ...titan.in_ranks.recipes import taken_from_base
    from ...titan.models import count_parameters
    from ...titan.parity import _same
    from ...titan.replacement import replaced_paths

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
