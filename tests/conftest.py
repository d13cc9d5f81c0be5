"""Shared helpers: a copy of the workflow in a temp folder, and Snakemake run inside it."""

from __future__ import annotations

import contextlib
import copy
import functools
import gc
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest
import yaml

from qwen3_pilot.lifetime import end_import_pause
from qwen3_pilot.recipe_registry import RECIPES

# The cyclic collector paused while pytest imports the test modules, and with them torch and torchtitan, until
# collection ends (pytest_collection_finish): collection then took 5 CPU-seconds instead of 9 here, and the shared
# run starts with the first test (the same pause as a rank's, qwen3_pilot.lifetime.end_import_pause).
gc.disable()

PROJECT = Path(__file__).resolve().parents[1]
# The corpus that ships with the pilot (config/config.yaml data.path): every test that reads a corpus reads it.
CORPUS = PROJECT / yaml.safe_load((PROJECT / "config" / "config.yaml").read_text())["data"]["path"]
WORKFLOW_FILES = ("config", "profiles", "workflow")
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))

# Collecting the tests imports torchtitan, and with it torch._dynamo, which creates its cache folder in the
# system temp folder unless told otherwise; the stages keep theirs under .cache/ (backends.cache_env).
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(PROJECT / ".cache" / "torchinductor"))
# Every Snakemake loads its SLURM plugin, which asks SLURM for its config (scontrol show config) as it loads.
# While a test uses the test cluster, /etc/slurm/slurm.conf names a controller that only the cluster's
# network namespace reaches, and each Snakemake the other tests start would wait 10 s for it. Outside that
# namespace the tests use no SLURM: an empty config makes SLURM's clients give up at once.
os.environ["SLURM_CONF"] = os.devnull


def pre_refactor_torchtitan(site: Path) -> Path:
    """A torchtitan from before the config refactor in `site`, laid out as 0.2.2 on PyPI is: TOML job config, no
    trainer module. Returns `site`, for PYTHONPATH."""
    for name, text in {"torchtitan/__init__.py": "", "torchtitan/config/__init__.py": "",
                       "torchtitan/config/job_config.py": "class JobConfig: pass\n", "torchtitan/train.py": ""}.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
    return site


def fake_fork(monkeypatch, registry_source: str) -> None:
    """A torchtitan_neuron package in this process with models.qwen3.config_registry holding `registry_source`."""
    import types

    for name in ("torchtitan_neuron", "torchtitan_neuron.models", "torchtitan_neuron.models.qwen3"):
        module = types.ModuleType(name)
        module.__path__ = []  # a package
        monkeypatch.setitem(sys.modules, name, module)
    registry = types.ModuleType("torchtitan_neuron.models.qwen3.config_registry")
    exec(registry_source, registry.__dict__)
    monkeypatch.setitem(sys.modules, registry.__name__, registry)


def copy_workflow(source: Path, root: Path) -> None:
    """The workflow's files (WORKFLOW_FILES) of `source` copied into `root`."""
    root.mkdir(parents=True, exist_ok=True)
    for name in WORKFLOW_FILES:
        if (source / name).is_dir():
            shutil.copytree(source / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source / name, root / name)


@functools.cache
def code_digests() -> Path:
    """The package's code digests, parsed once per session (parse_time/code.py's cache, keyed by each file's
    sha256, so it holds for any copy of the same files): each new workspace starts with it, and its first
    Snakemake reads them instead of parsing the package again."""
    import tempfile

    from qwen3_pilot.parse_time.code import CodeCache, stage_code

    cache = CodeCache(Path(tempfile.mkdtemp(prefix="code-digests-")) / "code_digests.json")
    for script in sorted((PROJECT / "workflow" / "scripts").glob("*.py")):
        for backend in ("cpu", "neuron"):
            stage_code(script, backend, cache)
    return cache.path


def make_workspace(root: Path, overlay: dict | None = None) -> Path:
    """Copies the workflow (not its results) into `root`, with the code digests' cache; `overlay` is written as
    config/test.yaml."""
    copy_workflow(PROJECT, root)
    (root / ".cache").mkdir(exist_ok=True)
    shutil.copy(code_digests(), root / ".cache" / "code_digests.json")
    if overlay is not None:
        (root / "config" / "test.yaml").write_text(yaml.safe_dump(overlay))
    return root


def venv_env(**added: str) -> dict[str, str]:
    """This environment with the venv's bin first on PATH, so that Snakemake and its jobs find its tools, and
    `added` over it."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", **added}


# Secrets as a user's environment holds them (dummy values): the shared run and test_secrets.py's archive run with
# them set, and test_secrets.py finds none in any file they wrote.
DUMMY_SECRETS = {
    "HF_TOKEN": "hf_pilotDummyTokenNeverWritten0123456789",
    "AWS_ACCESS_KEY_ID": "AKIAPILOTDUMMY0NEVER0",
    "AWS_SECRET_ACCESS_KEY": "pilotDummySecretAccessKeyNeverWritten/0123",
}


def set_archive(ws: Path, **settings) -> None:
    """config/test.yaml (the run's overlay) with the archive settings added."""
    path = ws / "config" / "test.yaml"
    overlay = yaml.safe_load(path.read_text()) or {}
    overlay["archive"] = settings
    path.write_text(yaml.safe_dump(overlay))


def run_snakemake(workspace: Path, *args: str, timeout: float = 1500,
                  env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    extra = ["--configfile", "config/test.yaml"] if (workspace / "config" / "test.yaml").exists() else []
    return subprocess.run(
        [SNAKEMAKE, *args, *extra], cwd=workspace, capture_output=True, text=True, timeout=timeout,
        env=env or venv_env()
    )


def record_fail_fast_run(ws: Path, env: dict[str, str] | None = None) -> None:
    """fail_fast recorded as run with the copy's config and code, without launching it (`--touch`): for a test about
    a later stage, whose change would otherwise launch fail_fast's three recipes first."""
    touched = run_snakemake(ws, "--cores", "1", "--touch", "results/fail_fast/summary.json", env=env)
    assert touched.returncode == 0, output(touched)[-3000:]


def planned_jobs(result: subprocess.CompletedProcess) -> dict[str, int]:
    """The 'Job stats' table of a dry run as {rule: count}; empty when there is nothing to do."""
    jobs: dict[str, int] = {}
    lines = result.stdout.splitlines() + result.stderr.splitlines()
    if "Job stats:" not in lines:
        return jobs
    for line in lines[lines.index("Job stats:") + 3:]:
        parts = line.split()
        if len(parts) != 2 or parts[0] == "total":
            break
        jobs[parts[0]] = int(parts[1])
    return jobs


def default_config(*overlays: dict) -> dict:
    """config/config.yaml with `overlays` laid over it (as --configfile does), the schema's defaults and the
    derived keys filled in (not checked: tests build broken configs from it)."""
    from snakemake.utils import validate

    from qwen3_pilot.parse_time.config import deep_update, fill_derived

    config = yaml.safe_load((PROJECT / "config" / "config.yaml").read_text())
    for overlay in overlays:
        config = deep_update(config, overlay)
    validate(config, str(PROJECT / "workflow" / "schemas" / "config.schema.yaml"))
    return fill_derived(config)


def backend_config(backend: str = "cpu", ranks: int = 2, **keys) -> dict:
    """The config keys a backend is built from (what the rules pass), the schema's defaults for the rest."""
    from qwen3_pilot.backends import BACKEND_CONFIG_KEYS

    config = default_config()
    return {**{key: config[key] for key in BACKEND_CONFIG_KEYS}, "backend": backend, "ranks": ranks, **keys}


# How Snakemake heads a job's block: "rule train:" in a dry run, "localrule train:" when it runs it in its own
# process, "checkpoint"/"localcheckpoint" for a checkpoint's job (fetch_weights).
JOB_BLOCK = re.compile(r"^(?:local)?(?:rule|checkpoint) (\w+):$")


def planned_job_blocks(result: subprocess.CompletedProcess) -> list[tuple[str, dict[str, str]]]:
    """The jobs a dry run plans, or a run starts, from their blocks ("rule train:" ... "wildcards:
    stage=train_hf") as (rule, wildcards), the default target's rule `all` left out."""
    jobs, rule, wildcards = [], None, {}
    for line in (result.stdout + result.stderr).splitlines() + [""]:
        if block := JOB_BLOCK.match(line):
            rule, wildcards = block.group(1), {}
        elif rule and line.strip().startswith("wildcards:"):
            wildcards = dict(pair.split("=", 1) for pair in line.split(":", 1)[1].strip().split(", "))
        elif rule and not line.startswith(" "):
            if rule != "all":
                jobs.append((rule, wildcards))
            rule = None
    return jobs


def planned_stages(result: subprocess.CompletedProcess) -> set[str]:
    """The stages a dry run plans."""
    from qwen3_pilot.stages import stage_of_job

    return {stage_of_job(rule, wildcards) for rule, wildcards in planned_job_blocks(result)}


@pytest.fixture
def stage_progress():
    """A stage's work in progress for the test (what StageRun sets around a stage): record_measured keeps the
    figures a stage module measures, for the failure record a test writes from them."""
    from qwen3_pilot.stage_progress import begin_progress

    with begin_progress() as progress:
        yield progress


@pytest.fixture
def workspace(tmp_path: Path):
    return lambda overlay=None: make_workspace(tmp_path / "ws", overlay)


# The fixtures of the shared pipeline run: a test that uses one is an end-to-end test, marked so here.
SHARED_RUN_FIXTURES = {"trained_run", "completed_run", "copy_of_run", "run_ahead"}


def pytest_collection_finish(session):
    end_import_pause()


def pytest_collection_modifyitems(items):
    def reads(item) -> set[str]:
        return SHARED_RUN_FIXTURES & set(getattr(item, "fixturenames", ()))

    def order(item) -> int:
        if not reads(item):
            return 0
        return 1 if reads(item) == {"trained_run"} else 3 if "run_ahead" in reads(item) else 2

    for item in items:
        if reads(item):
            item.add_marker(pytest.mark.e2e)
    # The others first, then what reads only the training stages (while the shared run goes on), then what
    # reads the finished run, those started ahead last (their bodies run meanwhile); each file's tests in order.
    items.sort(key=order)


@dataclass(frozen=True)
class AheadBody:
    """A started_ahead test's body and when it starts."""

    body: Callable[[Path, Path], None]
    # Once the shared run's training stages are done, on copy_finished_stages' copy (the body reruns one of them),
    # instead of once the whole run is, on copy_run's.
    once_trained: bool
    # The shared workspace itself, not a copy: the body only reads it (it relaunches recorded launches into its
    # scratch folder).
    in_place: bool
    # Among the bodies on the finished run, one of the longest (it trains stages again): those start first, so that
    # the session does not end on one of them running alone beside an idle core.
    longest: bool = False


# Bodies of long tests started in the background (started_ahead), by (module, test name).
AHEAD: dict[tuple[str, str], AheadBody] = {}


def started_ahead(body: Callable[[Path, Path], None] | None = None, *, once_trained: bool = False,
                  in_place: bool = False, longest: bool = False):
    """A long test on the shared run whose body runs in a background thread, on a copy of its own (`in_place`:
    on the shared workspace, which it only reads), as soon as the run has finished (`once_trained`: as soon as its
    training stages have), while the main thread goes through the other tests; the test itself (ordered last)
    waits for its body and fails with its error. The machine's two cores are otherwise partly idle in that part
    of the session: each of those tests is mostly one Snakemake process or one launch, and so is the shared run
    between its launches. Two bodies run at a time, those started once trained first: the longest (the killed
    runs) alone took as long as all the main thread's tests on the finished run. `body(workspace, scratch)` takes
    no fixtures (pytest's are not made for threads) and leaves the process's environment alone (os.environ is the
    main thread's too, and the processes a body starts inherit it: a Snakemake started by a body gets AHEAD_ENV,
    and the two-host test hands its hosts' variables to its own launch instead of setting them)."""
    if body is None:
        return functools.partial(started_ahead, once_trained=once_trained, in_place=in_place, longest=longest)
    key = (body.__module__, body.__name__)
    AHEAD[key] = AheadBody(body, once_trained, in_place, longest)

    def test(run_ahead):
        run_ahead[key].result()

    test.__name__, test.__qualname__, test.__doc__, test.__module__ = (
        body.__name__, body.__qualname__, body.__doc__, body.__module__)
    return test


def ahead_bodies(items) -> list[tuple[str, str]]:
    """The started_ahead bodies of the selected tests in the order they start: those started once trained
    first (they would otherwise wait behind a body that waits for the whole run), then the longest, then in the
    tests' order."""
    keys = [(item.module.__name__, item.originalname) for item in items if "run_ahead" in item.fixturenames]
    return sorted((key for key in keys if key in AHEAD),
                  key=lambda key: (not AHEAD[key].once_trained, not AHEAD[key].longest))


# The environment the started_ahead bodies give the processes they start (venv_env as the session began): a
# test in the main thread may set variables for its own while a body runs (monkeypatch.setenv).
AHEAD_ENV = venv_env()


def run_body_ahead(ahead: AheadBody, shared: SharedRun, scratch: Path, ending) -> None:
    if ahead.once_trained:
        shared.trained()
    else:
        shared.future.result()
    if ending.is_set():  # the session ended early (pytest -x, Ctrl-C): the test will not be reached
        return
    if ahead.in_place:
        ahead.body(shared.workspace, scratch)
        return
    copy = copy_finished_stages if ahead.once_trained else copy_run
    ahead.body(copy(shared.workspace, scratch / "ws"), scratch)


def output(result: subprocess.CompletedProcess) -> str:
    return result.stdout + result.stderr


# The FSDP plans computed in this session, by run_plan_subprocess's arguments.
_PLANS: dict[tuple, dict] = {}


def plan_key(flavor, world_size, hbm_per_rank_gib, python=sys.executable, *, rank=0) -> tuple:
    return flavor, world_size, hbm_per_rank_gib, python, rank


def keep_plan(plan: dict, *args, **kwargs) -> None:
    """A plan the real run_plan_subprocess made (test_rank_plan.py's), kept for plan_once's callers with the same
    arguments."""
    _PLANS.setdefault(plan_key(*args, **kwargs), copy.deepcopy(plan))


@pytest.fixture
def plan_once(monkeypatch):
    """qwen3_pilot.rank_plan.run_plan_subprocess computed once per session for each set of arguments (a
    64-rank plan takes a fresh interpreter about 10 s; every preflight asks for the same one); each caller still
    gets the plan written to its own out_path. test_rank_plan.py tests the real subprocess and its file."""
    from qwen3_pilot import rank_plan

    real = rank_plan.run_plan_subprocess

    def cached(flavor, world_size, hbm_per_rank_gib, out_path, python=sys.executable, *, rank=0):
        key = plan_key(flavor, world_size, hbm_per_rank_gib, python, rank=rank)
        if key not in _PLANS:
            _PLANS[key] = real(flavor, world_size, hbm_per_rank_gib, out_path, python, rank=rank)
        else:
            Path(out_path).parent.mkdir(parents=True, exist_ok=True)
            Path(out_path).write_text(json.dumps(_PLANS[key]))
        return copy.deepcopy(_PLANS[key])

    monkeypatch.setattr(rank_plan, "run_plan_subprocess", cached)


# The e2e tests' config: 2 gloo ranks, the offline corpus, a small fixture. Both compile checks use aot_eager
# (Dynamo and AOTAutograd; through the custom ops in kernel_numerics) instead of inductor, whose cold C++ builds
# took 35 s of the shared run on 2 cores in kernel_numerics and 34 CPU-seconds (27 of them gcc) in the benchmark's
# cold compiled run: `make report` runs both with inductor, and in `make test` inductor compiles transformers'
# flex attention (tests/e2e/test_training_e2e.py). The benchmark measures the native recipe only (eager, compiled
# cold and warm): its moe_reduced runs (replaced and plain: two launches, 31 CPU-seconds) are the moe_reduced
# stage's launches again with other step counts; tests/test_benchmark.py checks what the stage gives each of them,
# and `make report` runs them. fail_fast launches each recipe on one rank: a rank is about 6 CPU-seconds of imports,
# and the suite runs fail_fast three times (the shared run, the transformers pin change, the missing-name test); the
# recipes on two ranks are the training stages' own launches (`make report` runs fail_fast on two).
SMALL = {
    "ranks": 2,
    "fail_fast": {"ranks": 1},
    # 60 pretraining steps: the loaded-weights gaps were 1.31 (native) and 5.32 (hf) nats against min_gap 1.0 (120
    # steps: 1.81 and 5.82, 13 CPU-seconds more).
    "fixture": {"steps": 60, "num_hidden_layers": 2},
    # 50 steps: the held-out loss fell by 0.058 (its threshold here 0.03; config.yaml's 100 steps and 0.05 are
    # make report's), in about 14 CPU-seconds less than 100.
    "convergence": {"steps": 50, "min_fall": 0.03},
    "benchmark": {"recipes": ["train_native"], "compile_backend": "aot_eager", "warmup_steps": 2, "measured_steps": 5},
    "kernel_numerics": {"compile": {"backend": "aot_eager"}},
}


SLURM_CLUSTER = PROJECT / "tests" / "slurm" / "cluster.sh"
SLURM_SNAKEMAKE = PROJECT / "tests" / "slurm" / "snakemake_polling.py"
# What test_slurm.py reads back from SLURM's accounting for its jobs (sacct -o ...).
SACCT_FIELDS = ("JobID", "Comment", "State", "NNodes", "AllocCPUS", "ReqMem", "Timelimit")


def slurm_unavailable() -> str | None:
    """Why the test SLURM cluster cannot run on this machine, or None when it can."""
    missing = [tool for tool in ("nsenter", "ip") if shutil.which(tool) is None]
    if os.geteuid() != 0 or missing:
        return f"needs root and nsenter, ip to run the SLURM daemons (uid {os.geteuid()}, missing: {missing or 'none'})"
    return None


def pytest_sessionstart(session):
    """A test cluster that a killed test run left behind (its client config in /etc/slurm stalls every SLURM query,
    and with it every Snakemake start) is stopped and removed before anything runs; one in use is left alone."""
    if slurm_unavailable() is None:
        cleaned = subprocess.run([str(SLURM_CLUSTER), "clean-stale"], capture_output=True, text=True, timeout=120,
                                 env={k: v for k, v in os.environ.items() if k != "SLURM_CONF"})
        if cleaned.stderr.strip():
            print(cleaned.stderr.strip())


@contextmanager
def slurm_cluster(state: Path):
    """tests/slurm/cluster.sh's one-node cluster for the block; yields the prefix that runs a command in its
    network namespace. Stopped however the block ends: a client config left behind without its controller
    stalls every later Snakemake start."""
    cluster_env = {key: value for key, value in os.environ.items() if key != "SLURM_CONF"}  # its own config
    try:
        started = subprocess.run([str(SLURM_CLUSTER), "start", str(state)], capture_output=True, text=True,
                                 timeout=600, env=cluster_env)
        assert started.returncode == 0, output(started)[-4000:]
        values = dict(line.split("=", 1) for line in started.stdout.splitlines() if "=" in line)
        yield ["nsenter", f"--net=/run/netns/{values['NETNS']}", "env", f"SLURM_CONF={values['SLURM_CONF']}"]
    finally:
        subprocess.run([str(SLURM_CLUSTER), "stop", str(state)], capture_output=True, timeout=120, env=cluster_env)


def in_cluster(prefix: list[str], *command: str, cwd: Path | None = None, timeout: float = 60,
               env: dict[str, str] | None = None):
    return subprocess.run([*prefix, *command], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=env or venv_env())


# The stages the relaunch tests read (their recorded launches), run first in the shared run: those tests then
# run while the rest of the DAG does (`trained_run`).
TRAINING_STAGES = tuple(recipe.stage for recipe in RECIPES)
FIRST = ["--prioritize", *(f"results/{stage}/summary.json" for stage in TRAINING_STAGES)]


def make_pipeline_run(root: Path) -> Path:
    """The whole DAG once on a small cpu config, in `shared_workspace(root)`, with Snakemake's local executor.
    (Through the test SLURM cluster it took about 40 s longer and 60 CPU-seconds more, each stage a SLURM job that
    starts Snakemake twice: tests/e2e/test_slurm.py runs a stage of each resource class and a training job there.)"""
    ws = shared_workspace(root)
    result = run_snakemake(ws, "--cores", "2", "results/report.html", *FIRST, env=venv_env(**DUMMY_SECRETS))
    assert result.returncode == 0, output(result)[-6000:]
    return ws


def shared_workspace(root: Path) -> Path:
    return root / "ws"


@dataclass
class SharedRun:
    """The shared run while it runs: its workspace (made before it starts) and its Future."""

    workspace: Path
    future: Future
    # The started_ahead tests' bodies, each started once the run has finished or its training stages have.
    ahead: dict[tuple[str, str], Future]

    def stage_done(self, stage: str) -> Path:
        """Waits until `stage` has written its summary (its sha256 record last), or the run ended without it."""
        record = self.workspace / "results" / stage / "summary.json.sha256"
        while not record.exists():
            if self.future.done():
                self.future.result()  # the run's own failure, if it failed
                assert record.exists(), f"the shared run ended without {record}"
            time.sleep(0.5)
        return self.workspace

    def trained(self) -> Path:
        """Waits until the training stages (TRAINING_STAGES, run first) have written their summaries."""
        for stage in TRAINING_STAGES:
            self.stage_done(stage)
        return self.workspace


@pytest.fixture(scope="session", autouse=True)
def pipeline_started(request, tmp_path_factory):
    """The shared run, started in the background with the session's first test when any selected test reads
    it, so that the tests that do not read it (collected first: pytest_collection_modifyitems) run while it
    runs; a SharedRun, or None when no selected test reads it."""
    if not any(item.get_closest_marker("e2e") for item in request.session.items):
        yield None
        return
    root = tmp_path_factory.mktemp("e2e")
    make_workspace(shared_workspace(root), SMALL)
    ahead = ahead_bodies(request.session.items)
    scratch = {key: tmp_path_factory.mktemp(key[1][:30]) for key in ahead}
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="pipeline") as pool, \
            ThreadPoolExecutor(max_workers=2, thread_name_prefix="ahead") as ahead_pool:
        shared, ending = SharedRun(shared_workspace(root), pool.submit(make_pipeline_run, root), {}), threading.Event()
        for key in ahead:
            shared.ahead[key] = ahead_pool.submit(run_body_ahead, AHEAD[key], shared, scratch[key], ending)
        yield shared
        ending.set()


@pytest.fixture(scope="session")
def trained_run(pipeline_started) -> Path:
    """The shared run's workspace once its training stages are done (TRAINING_STAGES, run first), while the rest
    of the DAG may still run: for tests that only read those stages' records and inputs and write elsewhere."""
    return pipeline_started.trained()


@pytest.fixture(scope="session")
def run_ahead(pipeline_started) -> dict[tuple[str, str], Future]:
    """The started_ahead tests' bodies, running or done."""
    return pipeline_started.ahead


@pytest.fixture(scope="session")
def completed_run(pipeline_started) -> Path:
    """The workspace of the one pipeline run every end-to-end check reads (make_pipeline_run), finished; tests that
    change it work on a copy (`copy_of_run`)."""
    return pipeline_started.future.result()


# .cache/ folders a copy of the run leaves out: torch.compile's caches and the ranks' TMPDIR.
UNCOPIED_CACHES = {"torchinductor", "triton", "tmp"}


# Held while a test edits a file of the shared run in place (edited_in_place) and while the run is copied
# (copy_run): a test running ahead in its own thread copies the run while others run, and must not copy a
# half-made edit (a dry run's bumped pin) as the run's own file.
SHARED_RUN_EDIT = threading.Lock()


def copy_run(run: Path, copy: Path) -> Path:
    """A copy of a finished workspace (results, logs and Snakemake's metadata included), without the compile and
    temp caches under .cache/ (over 300 MB that no rerun of a stage needs: they refill)."""
    caches = run / ".cache"

    def skip_caches(folder: str, names: list[str]) -> list[str]:
        return [name for name in names if name in UNCOPIED_CACHES] if Path(folder) == caches else []

    with SHARED_RUN_EDIT:
        shutil.copytree(run, copy, symlinks=True, ignore=skip_caches)
    return copy


def copy_finished_stages(run: Path, copy: Path) -> Path:
    """A copy of the shared run while it runs, for a body that reruns a finished stage: the workflow; the folder
    of every stage finished so far (its summary's sha256 record, written last, in place); and from the others only
    the files recorded whole (a sha256 record beside them), such as the package stamps that pin_env's own summary,
    run later, collects. Snakemake's metadata, the logs, the caches and anything half-written stay behind:
    Snakemake in the copy finds the finished results up to date by their times alone (it says that their
    metadata is missing) and reruns only what it is told to."""
    with SHARED_RUN_EDIT:
        copy_workflow(run, copy)
        for stage in sorted((run / "results").iterdir()):
            if (stage / "summary.json.sha256").exists():
                shutil.copytree(stage, copy / "results" / stage.name, symlinks=True)
                continue
            for folder, _, names in os.walk(stage):  # os.walk passes over a folder that a running stage renames
                for record in sorted(Path(folder) / name for name in names if name.endswith(".sha256")):
                    for path in (record.with_suffix(""), record):
                        target = copy / path.relative_to(run)
                        target.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(path, target)
    return copy


@contextmanager
def edited_in_place(*edits: tuple[Path, Callable[[str], str]]):
    """Each (path, edit): the file of the shared run rewritten by its edit for the block, then restored; no copy of
    the run is taken meanwhile (SHARED_RUN_EDIT)."""
    with SHARED_RUN_EDIT:
        texts = {path: path.read_text() for path, _ in edits}
        try:
            for path, edit in edits:
                path.write_text(edit(texts[path]))
            yield
        finally:
            for path, text in texts.items():
                path.write_text(text)


@pytest.fixture
def copy_of_run(completed_run, tmp_path):
    """A throwaway copy of the completed workspace (copy_run)."""
    return copy_run(completed_run, tmp_path / "ws")


def skip_or_fail(variable: str, reason: str) -> NoReturn:
    """A test whose tool or privilege is missing (`reason`): skipped, or failed where `variable` is set (.ci/run
    sets each REQUIRE_* so that CI runs every tier rather than skipping one)."""
    if os.environ.get(variable):
        pytest.fail(f"{variable} is set: {reason}")
    pytest.skip(reason)


@pytest.fixture
def chromium():
    """Headless Chromium (tests/browser.py) for the tests that use it; CI requires it (REQUIRE_CHROMIUM)."""
    from browser import CHROMIUM

    if CHROMIUM is None:
        skip_or_fail("REQUIRE_CHROMIUM", "no chromium on PATH (Debian: apt-get install chromium; .ci/run installs it)")


def metric_lines(run_dir: Path) -> int:
    metrics = run_dir / "metrics.jsonl"
    return len(metrics.read_text().splitlines()) if metrics.exists() else 0


def wait_for_ends(pids: list[int]) -> None:
    """Until each of `pids` has ended, as the kernel reports it (a pidfd turns readable at the process's exit),
    however long a loaded machine takes: a test asserts what the ends left behind, not how soon they came."""
    import select

    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:  # already gone
            continue
        try:
            select.select([fd], [], [])
        finally:
            os.close(fd)


def stopped(pids: list[int]) -> None:
    """Stops each of `pids` (SIGSTOP) and returns once the kernel shows each stopped: from here on none of them runs
    an instruction until it is let go (`released_once_signalled`)."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    for pid in pids:
        while _process_status(pid).get("State", "T").split()[0] not in {"T", "Z", "X"}:
            time.sleep(0.05)


def released_once_signalled(pids: list[int]) -> None:
    """Lets the stopped `pids` go on (SIGCONT) once each has ended or has a signal pending (sent while it was
    stopped; the kernel delivers it before the process runs another instruction), then waits for their ends. A
    process that no signal reaches would run on: the wait fails after 300 s (a hang guard, not a figure under
    test) naming it."""
    deadline = time.monotonic() + 300
    waiting = list(pids)
    while waiting:
        waiting = [pid for pid in waiting if not _ended_or_signalled(pid)]
        assert time.monotonic() < deadline, f"no signal reached {waiting} in 300 s"
        time.sleep(0.05)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    wait_for_ends(pids)


def _process_status(pid: int) -> dict[str, str]:
    """/proc/PID/status as fields ({} once the process is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return {}
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def _ended_or_signalled(pid: int) -> bool:
    status = _process_status(pid)
    if not status or status["State"].split()[0] in {"Z", "X"}:
        return True
    # ShdPnd: signals sent to the process and not yet delivered (SigPnd: to its main thread).
    return int(status["ShdPnd"], 16) != 0 or int(status["SigPnd"], 16) != 0


def rank_processes(ws) -> list[int]:
    """This workspace's torchrun ranks still running (torchrun's own command line names their module too)."""
    from qwen3_pilot.unlock import workflow_processes

    return [pid for pid, command in workflow_processes(ws)
            if "qwen3_pilot.titan.in_ranks.train_entry" in command and "torch.distributed.run" not in command]


def trainer_processes(ws) -> list[int]:
    """This workspace's torchrun ranks and launchers still running (the workflow's processes, by working folder
    and command line, that are a trainer's)."""
    from qwen3_pilot.unlock import workflow_processes

    return [pid for pid, command in workflow_processes(ws)
            if "qwen3_pilot.titan.in_ranks.train_entry" in command or "torch.distributed.run" in command]


def wait_for_steps(snakemake, run_dir, steps):
    deadline = time.monotonic() + 300  # a hang guard, not a figure under test
    while not ((run_dir / "launcher.pid").exists() and metric_lines(run_dir) >= steps):
        assert snakemake.poll() is None and time.monotonic() < deadline, "training ended before it was interrupted"
        time.sleep(0.2)
