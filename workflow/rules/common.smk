# Configuration checks and the small helpers the rules call for inputs and params.
import sys
from pathlib import Path

from snakemake.utils import validate

# The project folder: the Snakefile lies in its workflow/ (the catalog's layout), and the paths below are the
# project's.
PROJECT_DIR = Path(workflow.basedir).parent
# The stage logic is a package beside the scripts; `make` installs it, this covers a bare checkout.
sys.path.insert(0, str(PROJECT_DIR / "workflow" / "scripts"))

from qwen3_pilot.archive.settings import pilot_config
from qwen3_pilot.artifacts import now_iso
from qwen3_pilot.backends import BACKEND_CONFIG_KEYS
from qwen3_pilot.parse_time.config import (
    check_renamed_keys,
    JUDGED_STAGES,
    resolve_config,
    config_digest,
    fail_fast_training,
    stage_judging,
    stage_measuring,
    stage_kernel_rules,
    stage_repeat_steps,
    stage_training,
)
from qwen3_pilot.backends.neuron.stack import read_release, StackError
from qwen3_pilot.backends.neuron.stack.installed import fork_head_files, release_pins
from qwen3_pilot.parse_time.code import CodeCache, stage_code
from qwen3_pilot.paths import HERE
from qwen3_pilot.pins import installed_version, read_pins
from qwen3_pilot.recipe_registry import (
    CONVERGENCE,
    FROM_FETCHED_WEIGHTS_STAGES,
    RECIPES,
    recipe_of,
)
from qwen3_pilot.stages import STAGES, UPSTREAM, downstream_of, skipped_stages
from qwen3_pilot.unlock import stale_lock_note

check_renamed_keys(config)
validate(config, schema="../schemas/config.schema.yaml")
resolve_config(config)

BACKEND = config["backend"]
# When this invocation began: the failed-run report tells this run's results from earlier runs' by it.
RUN_STARTED = now_iso()
# A Snakemake killed outright leaves its lock, and this command would stop on it: say which command clears it.
# (Not inside a cluster job: the main Snakemake holding the lock runs on another host.)
if (
    workflow.is_main_process
    and "--unlock" not in sys.argv
    and (STALE_LOCK := stale_lock_note(PROJECT_DIR))
):
    print(STALE_LOCK, file=sys.stderr)
PINS_FILE = f"workflow/envs/{BACKEND}.txt"
PINS = read_pins(PROJECT_DIR / PINS_FILE)
# Every package of the environment with its hashes (make lock); the neuron backend's is the SDK release's, made
# on an instance.
LOCK_FILE = f"workflow/envs/{BACKEND}.lock"
# OS packages a stage depends on, {name: the release's version}; the stages that run on the device depend on
# DEVICE_PACKAGES too, and verify_ranks on RANK_CHECK_PACKAGES (neuron-ls). None of them exists on cpu.
OS_PINS, DEVICE_PACKAGES, RANK_CHECK_PACKAGES = {}, (), ()
if BACKEND == "neuron":
    # The SDK release's file pins its pip components, OS packages and the TorchTitan Neuron fork (git, no index).
    try:
        NEURON_STACK = read_release(config["neuron"]["sdk"], PROJECT_DIR)
    except StackError as error:
        raise ValueError(str(error)) from None
    PINS = {**PINS, **release_pins(NEURON_STACK)}
    OS_PINS = NEURON_STACK.os_packages
    DEVICE_PACKAGES = (*NEURON_STACK.python, *NEURON_STACK.system)
    RANK_CHECK_PACKAGES = tuple(NEURON_STACK.tools)
    LOCK_FILE = NEURON_STACK.lock_file


def get_lock_file():
    return [LOCK_FILE] if (PROJECT_DIR / LOCK_FILE).exists() else []


# Used with --use-conda only; the same pins, so both setups run the same software.
SOFTWARE_ENV = f"../envs/{BACKEND}.yaml"
USES_FIXTURE = config["weights"]["source"] == "fixture"


def get_pin(wildcards):
    return PINS[wildcards.package].specifier


def get_installed(wildcards):
    return installed_version(wildcards.package)


def get_os_pin(wildcards):
    return OS_PINS[wildcards.package]


def get_os_installed(wildcards):
    """The OS package's version on the host that parses (one instance: the instance; under SLURM the login
    node, where it is usually absent: the stamp job on an instance is what checks it).
    """
    from qwen3_pilot.backends.neuron.machine import read_os_packages

    return read_os_packages([wildcards.package])[wildcards.package]


def get_source(wildcards):
    """Where the fork comes from on neuron (its git URL and ref: a release that moves the ref reruns its stamp
    before any install); nothing for a package from an index."""
    if BACKEND == "neuron" and wildcards.package == NEURON_STACK.fork.distribution:
        return NEURON_STACK.fork.source
    return ""


def get_sdk_release():
    """pin_env's record of the whole Neuron stack names the release; nothing on cpu."""
    return NEURON_STACK.release if BACKEND == "neuron" else None


def get_git_head(wildcards):
    """The fork clone's HEAD for the fork's stamp on neuron (a new commit reruns it); nothing otherwise."""
    if BACKEND == "neuron" and wildcards.package == NEURON_STACK.fork.distribution:
        return fork_head_files(NEURON_STACK)
    return []


def pin_stamps(*packages):
    """The per-package stamps a stage depends on: a bump of any other pin leaves the stage cached."""
    missing = [p for p in packages if p not in PINS and p not in OS_PINS]
    if missing:
        raise ValueError(f"{PINS_FILE}: no pin for {', '.join(missing)}")
    return [
        f"results/pin_env/{'os_packages' if p in OS_PINS else 'packages'}/{p}.json"
        for p in dict.fromkeys(packages)
    ]


def get_corpus_source():
    return [config["data"]["path"]] if config["data"]["path"] else []


def get_weights_source():
    return ["results/fixture_checkpoint/summary.json"] if USES_FIXTURE else []


def get_weights_cache():
    if USES_FIXTURE:
        return "results/fixture_checkpoint/fixture/hub_cache"
    return str(HERE.cache / "huggingface" / "hub")


# A torchrun stage takes every core it is given: its ranks share them (OMP_NUM_THREADS per rank). Not
# workflow.cores, which raises where no --cores is given: `snakemake --report` must work without one.
ALL_CORES = workflow.resource_settings.cores or 1


# On a SLURM cluster (profiles/slurm sets each rule's time, memory and exclusivity): the placement and size
# that come from the workflow config. Local runs ignore these resources.
def slurm_placement(partition):
    placement = {
        "slurm_partition": partition,
        "slurm_account": config["slurm"]["account"],
    }
    return {key: value for key, value in placement.items() if value is not None}


def get_instance_resources(nodes=None):
    """A stage that runs on the instances: `nodes` of them (default config `nodes`), with their CPUs and the
    Neuron devices. On more than one node the job is an MPI-style job: the plugin does not wrap it in
    `srun -n1`, and the stage starts torchrun on every node with srun itself (multi_node.launcher).
    """
    slurm, nodes = config["slurm"], nodes or config["nodes"]
    resources = {"nodes": nodes, **slurm_placement(slurm["partition"])}
    if nodes > 1:
        resources.update(mpi="srun", tasks=nodes)
    sizes = {
        "cpus_per_task": slurm["instance_cpus"],
        "constraint": slurm["constraint"],
        "gres": slurm["gres"],
    }
    resources.update({key: value for key, value in sizes.items() if value is not None})
    return resources


def get_small_resources():
    """A stage that needs no instance: a share of a small node."""
    return slurm_placement(
        config["slurm"]["small_partition"] or config["slurm"]["partition"]
    )


def get_launch_message(stage, module):
    """On more than one node, what the job launches, for `snakemake -n` to show: the stage's torchrun on every
    node (built by the code the stage launches with). On one node, None: Snakemake's usual job listing.
    """
    if config["nodes"] == 1:
        return None
    from qwen3_pilot.backends import make_backend

    backend = make_backend(config, str(HERE.cache))
    command = backend.torchrun_command(
        "python", backend.ranks_per_node, module, ["..."]
    )
    return (
        f"{stage} on {config['nodes']} nodes x {backend.ranks_per_node} ranks, launched from the first node "
        f"of the job's allocation: {' '.join(command)}"
    )


def get_backend_config():
    """The keys a backend is built from; rules pass only these, so other config edits leave them cached. Not
    neuron.sdk: the release reaches the stages through the stamps of the components it moves.
    """
    backend = {key: config[key] for key in BACKEND_CONFIG_KEYS}
    backend["neuron"] = {k: v for k, v in backend["neuron"].items() if k != "sdk"}
    return backend


def get_fetched_weights(wildcards):
    """The fetched checkpoint, named by its content: fetch_weights is a checkpoint, so these are read only
    once it has run, and Snakemake plans its consumers again then. Its manifest (every file's sha256, nothing
    about the fetch) is a small input whose checksum Snakemake compares with the one it recorded, and the
    folder is ancient(): its dates say nothing the manifest does not, and a consumer checks each file against
    the manifest before it reads one (chain of custody). So a refetch that changes no byte (a hub client bump)
    reruns no consumer."""
    checkpoints.fetch_weights.get()
    return {
        "checkpoint": ancient("results/fetch_weights/checkpoint"),
        "weights": "results/fetch_weights/manifest.json",
    }


def get_fail_fast(wildcards):
    """fail_fast's verdict, named by its content, for a device stage: fail_fast is a checkpoint, so this is read
    only once it has run, and Snakemake plans the device stages again then. passed.json holds which checks passed
    and nothing that varies between runs (no times, no losses): a small input whose checksum Snakemake compares with
    the one it recorded. So a rerun of fail_fast that passes the same checks (an edit of its own code, a bump of a
    package one recipe uses) reruns no other recipe's stage, and each device stage's own params and code still
    decide its reruns (an ancient() edge would hide them: Snakemake masks what is downstream of a job it reruns).
    """
    # fail_fast reads the weights: waiting for fetch_weights too, a device stage that reads no weights
    # (kernel_numerics) is planned again with them, as its judge is (replanned_after_checkpoints). fail_fast first:
    # while both are due, the first that raises is the edge Snakemake draws (stages.UPSTREAM's test reads --dag).
    checkpoints.fail_fast.get()
    checkpoints.fetch_weights.get()
    return {"fail_fast": "results/fail_fast/passed.json"}


def replanned_after_checkpoints(stage):
    """Nothing to read, for a job further down from a checkpoint (fetch_weights, fail_fast) than its consumers (a
    judge of one of them, compare_recipes, export_reload): while the checkpoint is due, it makes the job wait for it,
    so that Snakemake plans it again once the checkpoint has run, as it does the consumers. Otherwise the job would
    keep the reason it was first planned on (a consumer that was due to run) and run although that consumer,
    planned again, did not.
    """
    # fail_fast first, as in get_fail_fast: in the other order a hub bump re-judged kernel_numerics' old record.
    for name in ("fail_fast", "fetch_weights"):
        if stage in downstream_of(name):
            getattr(checkpoints, name).get()
    return {}


def get_replanned_after_checkpoints(wildcards):
    return replanned_after_checkpoints(wildcards.get("stage", "compare_recipes"))


def get_export_reload_replanned(wildcards):
    return replanned_after_checkpoints("export_reload")


# Training stages: what every torchrun stage reads besides the fetched weights (get_fetched_weights), and the
# pins each recipe depends on.
def train_inputs(*packages):
    return {
        "stamps": pin_stamps(*packages, *DEVICE_PACKAGES),
        "corpus": "results/fetch_corpus/c4_test",
        # The producers' summaries: the stage checks the files it consumes against what they recorded.
        "corpus_summary": "results/fetch_corpus/summary.json",
        # The ranks' measured record (the peak FLOPS), not verify_ranks' verdict: a bandwidth floor edit re-judges
        # verify_ranks alone.
        "ranks": "results/verify_ranks/measured.json",
    }


# The pins any recipe's training imports: fail_fast launches them all.
RECIPE_PACKAGES = tuple(sorted({p for recipe in RECIPES for p in recipe.packages}))


def get_fail_fast_kernel_rules():
    return {
        recipe.stage: stage_kernel_rules(config, recipe.stage) for recipe in RECIPES
    }


def get_fail_fast_moe():
    """The reduced MoE's counts; fail_fast gives it its own tiny widths (fail_fast.moe_width)."""
    return {
        key: config["moe"][key] for key in ("layers", "experts", "top_k", "rope_theta")
    }


def get_train_inputs(wildcards):
    return train_inputs(*recipe_of(wildcards.stage).packages)


def get_training(wildcards):
    """The training settings one training stage's runs read (its recipe's own, no threshold)."""
    return stage_training(config, wildcards.stage)


def get_repeat_steps(wildcards):
    """The steps of this recipe's random-init control that are launched twice (training.repeat); 0: none."""
    return stage_repeat_steps(config, wildcards.stage)


def get_judging(wildcards):
    """The thresholds, tolerances and reasons one stage is judged by (rule judge's params)."""
    return stage_judging(config, wildcards.stage)


def get_benchmark_training():
    return stage_training(config, *config["benchmark"]["recipes"])


def get_recipe_kernel_rules(wildcards):
    return get_kernel_rules(wildcards.stage)


def get_benchmark_inputs():
    """What every torchtitan run reads, with the pins of each benchmarked recipe (the reduced MoE's are
    moe_reduced's): a transformers bump reruns the benchmark only when it measures train_hf.
    """
    packages = {
        p
        for recipe in config["benchmark"]["recipes"]
        for p in recipe_of(recipe).packages
    }
    return train_inputs(*sorted(packages))


def get_benchmark_kernel_rules():
    return {
        recipe: get_kernel_rules(recipe)["rules"]
        for recipe in config["benchmark"]["recipes"]
    }


def get_kernel_rules(stage):
    """One training stage's kernel replacements: only that stage's part of config `kernels` (its loss
    tolerance is the judge's, get_judging)."""
    return {"rules": stage_kernel_rules(config, stage)}


def record_invocation_plan():
    """When the run starts (onstart): Snakemake's planned jobs and its reason for each, for the report's
    "ran in this invocation, and why" (qwen3_pilot.parse_time.plan)."""
    from qwen3_pilot.parse_time.plan import record_plan, snakemake_plan

    record_plan(snakemake_plan(workflow.dag), started=RUN_STARTED)


def forget_invocation_plan():
    """When the run ends, either way: a later report never takes this plan for its own invocation's."""
    from qwen3_pilot.parse_time.plan import PLAN

    PLAN.unlink(missing_ok=True)


def get_stage_summaries():
    """The report's inputs: the summary of each stage the workflow builds (qwen3_pilot.stages.STAGES and
    UPSTREAM, the one list of stages) that this config does not skip."""
    skipped = skipped_stages(config)
    return {
        stage: f"results/{stage}/summary.json"
        for stage, _ in STAGES
        if stage in UPSTREAM and stage not in skipped
    }


# Each package file's code digest by its bytes' sha256, kept in the workflow folder: a parse reads what an earlier
# one parsed (parse_time/code.py).
CODE_CACHE = CodeCache(HERE.cache / "code_digests.json")


def get_code(script):
    """The digest of the code a rule's thin script runs (its script, the package modules it imports or starts
    by name, the configured backend's module), as the rule's `code` param: Snakemake's params trigger reruns
    exactly the jobs whose code changed in what runs (a comment or docstring edit changes no digest).
    Snakemake's own code trigger stays on: it sees the thin script's date only, which a failed run's report
    relies on (pilot_report.build_failed_report dates that report 1970 so that the next run rebuilds it).
    """
    return stage_code(
        PROJECT_DIR / "workflow" / "scripts" / script, BACKEND, CODE_CACHE
    ).digest


def get_report_page_templates():
    """The report page's templates (its Python is in the report rule's `code`): an edit to one rebuilds the
    report from the same summaries, and nothing else. Relative to the workflow folder, like every other input,
    so that a copy of the folder keeps its report."""
    templates = Path("workflow") / "scripts" / "qwen3_pilot" / "templates"
    return sorted(
        str(templates / t.name) for t in (PROJECT_DIR / templates).glob("*.j2")
    )


def write_failed_report():
    """After a failed run (onerror): results/report.{html,json} from what is on disk, with the failed
    stages, what they measured and the stages they blocked; the run still exits non-zero.
    """
    from qwen3_pilot.archive.settings import archive_failed_alone
    from qwen3_pilot.pilot_report import build_failed_report

    # `snakemake archive` failed after the pilot finished: its report stays the one that was archived.
    if archive_failed_alone(Path("results"), RUN_STARTED):
        print(
            "the archive failed (results/failures/archive.json); results/report.html is left as it was",
            file=sys.stderr,
        )
        return
    try:
        failed_report = build_failed_report(
            config=pilot_config(config),
            config_digest=config_digest(pilot_config(config)),
            workflow_dir=PROJECT_DIR,
            results=Path("results"),
            run_started=RUN_STARTED,
        )
    except (
        Exception
    ) as error:  # the run has failed already; say why there is no report, do not mask it
        print(
            f"no report of the failed run: {type(error).__name__}: {error}",
            file=sys.stderr,
        )
        return
    failed = [s["stage"] for s in failed_report["stages"] if s["status"] == "fail"]
    print(
        f"the failed run's report (failed: {', '.join(failed) or 'no stage record'}): results/report.html",
        file=sys.stderr,
    )
