"""One module per stage of the pilot, each with the `run(...)` its thin script (workflow/scripts/<stage>.py)
calls inside its StageRun (stage_run.py). They run in the stage process that Snakemake starts: they read the inputs,
launch or compute, and write the stage's summary; the logic they call lives in the package's library
modules, with unit tests. Code that runs inside torchrun's ranks is in qwen3_pilot.titan.in_ranks.

The stage list lives here, once: the pilot's stages in order with their titles, what each consumes, which jobs
are which stage, and which stages a config skips. Torch-free and read at parse time (workflow/rules/common.smk).
"""

from __future__ import annotations

from typing import Any

from ..recipe_registry import FROM_FETCHED_WEIGHTS_STAGES

# The pilot in its order, each with its title (config values filled in by `titles`): the one list of
# stages. A stage with no summary among the inputs appears as not_run, with the reason.
STAGES: tuple[tuple[str, str], ...] = (
    ("pin_env", "Pin and verify the environment"),
    ("fetch_corpus", "Fetch the corpus"),
    ("fixture_checkpoint", "Publish the fixture checkpoint (cpu backend)"),
    ("fetch_weights", "Fetch the weights ({weights[repo_id]})"),
    ("verify_ranks", "Verify the {ranks} ranks and the {plan[world_size]}-rank plan of Qwen3-{plan[flavor]}"),
    ("fail_fast", "Fail fast at tiny widths"),
    ("train_hf", "Train the Transformers-backend 4B recipe ({training[steps]} steps)"),
    ("train_native", "Train the native torchtitan 4B recipe ({training[steps]} steps)"),
    ("compare_recipes", "Compare the two recipes' step-1 losses"),
    ("convergence", "Convergence: the native recipe {convergence[steps]} steps, its held-out loss"),
    ("export_reload", "Export to Hugging Face safetensors and reload"),
    ("kernel_numerics", "Kernel numerics: RoPE and MoE against PyTorch"),
    ("moe_reduced", "Train the reduced MoE ({moe[layers]} layers, {moe[experts]} experts, top-{moe[top_k]})"),
    ("benchmark", "Warm-up and steady-state benchmarks"),
)
# What each stage consumes from the others (workflow/rules/*.smk; pin_env stands for its per-package stamps). A test
# checks it against Snakemake's own job graph.
UPSTREAM: dict[str, tuple[str, ...]] = {
    "pin_env": (),
    "fetch_corpus": (),
    "fixture_checkpoint": ("fetch_corpus",),
    "fetch_weights": ("pin_env", "fixture_checkpoint"),
    "verify_ranks": ("pin_env",),
    "fail_fast": ("pin_env", "fetch_corpus", "fetch_weights"),
    "train_hf": ("pin_env", "fetch_corpus", "fetch_weights", "verify_ranks", "fail_fast"),
    "train_native": ("pin_env", "fetch_corpus", "fetch_weights", "verify_ranks", "fail_fast"),
    "compare_recipes": FROM_FETCHED_WEIGHTS_STAGES,
    "convergence": ("pin_env", "fetch_corpus", "fetch_weights", "verify_ranks", "fail_fast"),
    "export_reload": ("pin_env", "fetch_weights", *FROM_FETCHED_WEIGHTS_STAGES),
    "kernel_numerics": ("pin_env", "fail_fast"),
    "moe_reduced": ("pin_env", "fetch_corpus", "fetch_weights", "verify_ranks", "fail_fast"),
    "benchmark": ("pin_env", "fetch_corpus", "fetch_weights", "verify_ranks", "fail_fast"),
}


def downstream_of(stage: str) -> set[str]:
    """The stages that consume `stage`'s outputs, directly or through others (UPSTREAM)."""
    found: set[str] = set()
    while grown := {name for name, upstream in UPSTREAM.items() if {stage, *found} & set(upstream)} - found:
        found |= grown
    return found


# Rules whose jobs are a stage without being named after it: pin_package's and pin_os_package's stamps are pin_env's,
# archive_copy's copy is the archive's, and rules `train` and `judge` are the stage their {stage} names.
JOB_STAGES = {"pin_package": "pin_env", "pin_os_package": "pin_env", "archive_copy": "archive"}


def stage_of_job(rule: str, wildcards: dict[str, str]) -> str:
    if rule in JOB_STAGES:
        return JOB_STAGES[rule]
    return wildcards["stage"] if "stage" in wildcards else rule


def skipped_stages(config: dict[str, Any]) -> dict[str, str]:
    """Stages that do not run with this config, with the reason."""
    if config["weights"]["source"] != "fixture":
        return {"fixture_checkpoint": "not used: weights.source is 'hub', the published weights are fetched"}
    return {}
