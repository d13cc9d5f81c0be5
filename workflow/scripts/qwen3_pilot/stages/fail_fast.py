"""Stage fail_fast: whether every recipe, kernel and compiled graph runs on this backend, in minutes and before any
launch of the real model. Each training stage's recipe is checked against the installed torchtitan's API and then
launched as that stage would launch it, for `steps` steps on `ranks` ranks, from a random-init checkpoint with the
fetched config.json's architecture and tokenizer at tiny widths (config fail_fast.width; the reduced MoE at
fail_fast.moe_width). Then one decoder block of the reduced MoE with the kernel replacements in runs forward and
backward eagerly and under torch.compile with the backend's compiler (fail_fast.compile_backend). Every check runs;
the stage fails when any did, naming each failed recipe or graph with its error and how long it took. The device
stages wait for this one (workflow/rules/fail_fast.smk).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..problems import problem_list
from ..recipe_registry import RECIPES, Recipe
from ..stage_progress import record_measured
from ..trainer_run import PARITY_FILE, ROUTER_LOAD_FILE

# The config.json fields that fail_fast.width replaces; everything else (vocabulary, RoPE, norms) is the fetched one.
WIDTH_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "generation_config.json")


class FailFastError(RuntimeError):
    pass


def timed_check(kind: str, name: str, check: Callable[[], Any], log: Callable[[str], None]) -> dict[str, Any]:
    """One check's row: pass with what it returned, or fail with its error; and how long it took either way."""
    started = time.perf_counter()
    try:
        result, error = check(), None
    except Exception as raised:  # every failure is a row: the next check still runs
        result, error = None, f"{type(raised).__name__}: {raised}"
    row = {"kind": kind, "name": name, "status": "fail" if error else "pass",
           "seconds": round(time.perf_counter() - started, 2), "result": result, "error": error}
    log(f"{kind} {name}: {row['status']} in {row['seconds']} s" + (f": {error}" if error else ""))
    return row


def tiny_checkpoint(fetched: Path, out: Path, width: dict[str, int], seed: int) -> Path:
    """A random-init Hugging Face checkpoint (safetensors) with the fetched config.json at `width` and the fetched
    tokenizer: what the 4B recipes load in their tiny launches. Built by transformers from the config's own
    model_type (a Qwen3 class transformers ships; never remote code)."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(fetched, trust_remote_code=False)
    for field in WIDTH_FIELDS:
        setattr(config, field, width[field])
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (fetched / name).is_file():
            shutil.copy2(fetched / name, out / name)
    return out


def tiny_training(training: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """A recipe's training settings (parse_time.config.fail_fast_training) with fail_fast's own run laid over them:
    its steps and sequence length, one row per rank and step, one warm-up step, the model sized from the tiny
    checkpoint's config.json (no registered flavor), and a fixed learning rate and seed (whether a recipe runs does
    not hang on them). Exactly the keys FAIL_FAST_OWN_KEYS names."""
    return {**training, "steps": settings["steps"], "seq_len": settings["seq_len"], "local_batch_size": 1,
            "global_batch_size": settings["ranks"], "warmup_steps": 1, "native_flavor": None, "lr": 1e-4, "seed": 0}


def recipe_check(recipe: Recipe, *, backend, checkpoint: Path, corpus_dir: Path, dataset: str, settings: dict[str, Any],
                 training: dict[str, Any], replacements: list[dict[str, str]], moe: dict[str, Any],
                 work: Path, log_path: Path) -> dict[str, Any]:
    """The recipe's API check, then its own launch as its stage builds it, at the tiny checkpoint and widths, for
    `steps` steps on `ranks` ranks, and for a recipe trained from the fetched weights its Hugging Face export: the
    losses it logged."""
    from ..reduced_moe import model_spec, reduced_moe_changes
    from ..titan.parity import read_checkpoint_values
    from ..titan.titan_api import check_torchtitan_api
    from ..training import export_files, launch_and_read, trainer_run

    check_torchtitan_api(backend.name, user=recipe.config_function)
    folder = work / recipe.stage
    folder.mkdir(parents=True, exist_ok=True)
    run = trainer_run(stage=recipe.stage, backend=backend, checkpoint=checkpoint, corpus_dir=corpus_dir,
                      dataset=dataset, training=tiny_training(training, settings),
                      # MFU is none of this stage's business: the backend's nominal peak, or 0 (torchtitan's own).
                      peak_flops_per_rank=backend.peak_flops_per_rank or 0.0,
                      parity_path=folder / PARITY_FILE, replacements=replacements)
    if not recipe.from_fetched_weights:  # the reduced MoE: random init, its own widths
        vocab = read_checkpoint_values(checkpoint)["vocab_size"]
        spec = model_spec(moe, settings["moe_width"], vocab, settings["seq_len"])
        run = run.replace(**reduced_moe_changes(spec, folder / ROUTER_LOAD_FILE))
    _, steps = launch_and_read(f"fail_fast ({recipe.stage})", backend, run, config_function=recipe.config_function,
                               recipe_path=folder / "recipe.json", run_dir=folder / "run", log_path=log_path,
                               nproc=settings["ranks"])
    if recipe.from_fetched_weights:
        export_files(f"fail_fast ({recipe.stage})", folder / "run", settings["steps"])
    return {"losses": [step["loss"] for step in steps]}


def compiled_block_check(settings: dict[str, Any], replacements: list[dict[str, str]], compile_backend: str,
                         device: str) -> dict[str, Any]:
    """One reduced-MoE decoder block at tiny widths with the moe_reduced stage's kernel replacements, forward and
    backward eagerly and under torch.compile(`compile_backend`): the largest differences, and that both are
    finite (a compile that fails raises here)."""
    import math

    import torch

    from ..titan.replacement import apply_converters, kernel_converters
    from .kernel_numerics.compile_checks import compiled_against_eager
    from .kernel_numerics.tiny_models import tiny_titan_config

    block = settings["block"]
    torch.manual_seed(0)
    config = apply_converters(tiny_titan_config(block, settings["seq_len"], moe=True), kernel_converters(
        replacements))
    model = config.build()
    model.init_states()
    model = model.to(device)
    tokens = torch.randint(0, block["vocab"], (1, settings["seq_len"]), generator=torch.Generator().manual_seed(1))
    compared = compiled_against_eager(model, tokens.to(device), compile_backend)
    if not all(math.isfinite(compared[key]) for key in ("logits_max_abs_diff", "grad_max_abs_diff")):
        raise FailFastError(f"the compiled block's outputs or gradients are not finite: {compared}")
    return compared


def run(*, backend_config: dict[str, Any], settings: dict[str, Any], training: dict[str, dict[str, Any]],
        kernels: dict[str, list[dict[str, str]]], moe: dict[str, Any], dataset: str, cache_root: str,
        checkpoint_dir: Path, corpus_dir: Path, work: Path, passed_path: Path, summary_path: Path, log_path: Path,
        log: Callable[[str], None]) -> dict[str, Any]:
    from ..artifacts import write_recorded_json
    from ..summary import StageSummary
    from ..training import clear_run_dir, usable_backend

    backend = usable_backend("fail_fast", backend_config, cache_root)
    clear_run_dir(work)
    compile_backend = backend.compile_backend if settings["compile_backend"] == "default" else settings[
        "compile_backend"]
    started = time.perf_counter()
    checkpoint = tiny_checkpoint(checkpoint_dir, work / "checkpoint", settings["width"], seed=0)
    checks = [
        timed_check("recipe", recipe.stage, lambda recipe=recipe: recipe_check(
            recipe, backend=backend, checkpoint=checkpoint, corpus_dir=corpus_dir, dataset=dataset, settings=settings,
            training=training[recipe.stage], replacements=kernels[recipe.stage], moe=moe, work=work,
            log_path=log_path), log)
        for recipe in RECIPES
    ]
    checks.append(timed_check("graph", f"reduced-MoE decoder block, kernels replaced, torch.compile({compile_backend})",
                              lambda: compiled_block_check(settings, kernels["moe_reduced"], compile_backend,
                                                           backend.device_type), log))
    seconds = round(time.perf_counter() - started, 2)
    record_measured(checks=checks, seconds=seconds)
    failed = [check for check in checks if check["status"] == "fail"]
    if failed:
        raise FailFastError(problem_list(
            f"fail_fast: {len(failed)} of {len(checks)} checks failed on the {backend.name} backend ({seconds} s)",
            [f"{check['kind']} {check['name']} ({check['seconds']} s): {check['error']}" for check in failed]))
    # What the device stages read (workflow/rules/common.smk, get_fail_fast): which checks passed, and nothing that
    # varies between runs, so that a rerun passing the same checks reruns none of them.
    write_recorded_json(passed_path, {"backend": backend.name, "compile_backend": compile_backend,
                                      "checks": [{key: check[key] for key in ("kind", "name", "status")}
                                                 for check in checks]})
    summary = StageSummary(
        stage="fail_fast", status="pass", backend=backend.name,
        figures={"checks": checks, "seconds": seconds, "ranks": settings["ranks"], "steps": settings["steps"],
                 "seq_len": settings["seq_len"], "compile_backend": compile_backend},
        proves=(f"On this backend and torchtitan each recipe builds, loads a checkpoint of the fetched architecture, "
                f"trains {settings['steps']} steps on {settings['ranks']} ranks and (the 4B recipes) exports, and a "
                "decoder block with the kernel replacements compiles and runs backward."),
        does_not_prove=("Anything at the real widths, sequence length or rank count: memory, compile time, the "
                        "loaded weights' quality or the kernels' numerics (kernel_numerics)."),
    )
    summary.add_artifacts([passed_path, *sorted(work.glob("*/recipe.json")), *sorted(work.glob("*/run/metrics.jsonl"))])
    return summary.write(summary_path)
