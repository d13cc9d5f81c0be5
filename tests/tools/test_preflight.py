"""The trn2 preflight on this machine: config/trn2.yaml passes with the published Qwen3 configs, and each
broken trn2 config fails with the key, the value and what was expected."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import PROJECT, fake_fork, pre_refactor_torchtitan

from qwen3_pilot.titan import api_names, titan_api
from qwen3_pilot.tools.preflight import DEFAULT_MODEL_CONFIGS
from qwen3_pilot.tools.preflight.run import preflight

TRN2 = PROJECT / "config" / "trn2.yaml"
# Every preflight here checks the same 64-rank FSDP plan: computed once (conftest.plan_once).
pytestmark = pytest.mark.usefixtures("plan_once")


def run(tmp_path, overlay: dict | None = None):
    files = [TRN2]
    if overlay is not None:
        (tmp_path / "broken.yaml").write_text(yaml.safe_dump(overlay))
        files.append(tmp_path / "broken.yaml")
    return preflight(files, DEFAULT_MODEL_CONFIGS, tmp_path / "preflight")


def test_the_trn2_config_passes_with_36_rope_replacements_and_the_parity_table(tmp_path, capsys, monkeypatch):
    from qwen3_pilot.tools.preflight import run as preflight_run
    from qwen3_pilot.tools.preflight.run import print_summary

    # The fork's launches stand in here (a finished cpu run is an end-to-end run's: fork_launches' own tests below).
    launched = []
    monkeypatch.setattr(preflight_run, "fork_launches", lambda clone, cpu_run, scratch: launched.append(
        (clone, cpu_run)) or {"torchtitan": "torchtitan 0.3.0", "level": "hf_datasets", "steps": 2,
                              "recipes": {"qwen3_native": "trained 5.771, 5.747"}})

    # With a rehearsal clone of the fork: checked at the release file's ref (release-2.33).
    upstream, fork, base = rehearsal_fork(tmp_path / "repos", installed_torchtitan_link)
    report = preflight([TRN2], DEFAULT_MODEL_CONFIGS, tmp_path / "preflight", fork=str(fork), upstream=str(upstream))
    assert (report["checks"]["fork"]["figures"]["ref"], report["checks"]["fork"]["figures"]["merge_base"]) == (
        "release-2.33", base)
    assert report["status"] == "pass", {k: v.get("error") for k, v in report["checks"].items()}
    # The fork's launches are run on the clone the fork check made, from the finished cpu run here by default.
    assert launched == [(tmp_path / "preflight" / "work" / "fork", PROJECT)]
    native = report["checks"]["train_native"]["figures"]
    assert native["parameters"] == 4_022_468_096 and native["layers"] == 36
    assert native["rope_hf_on_every_layer"] == 36
    # config/trn2.yaml's collective timeouts reach the trainer (torchtitan's own are 300 s and 100 s).
    assert native["comm_timeouts_s"] == {"init": 3600, "train": 1800}
    # config/trn2.yaml trains the native 4B recipe with the replacement (kernels.train_native), and its plain twin.
    assert native["kernel_replacements"] == {"rope_hf": 36}
    # The base the recipe took: the fork's Qwen3 recipe on a trn2 where it has one; upstream's here (no fork).
    assert native["base"] == "torchtitan.models.qwen3.config_registry:qwen3_32b"
    # The base recipe's model spec is kept around the checkpoint's model: its parallelize function (the fork's
    # where its recipe is the base), and its SPMD backend; the MoE recipe's trainer takes the same base.
    assert native["parallelize_fn"] == "torchtitan.models.qwen3.parallelize.parallelize_qwen3"
    assert native["spmd_backend"] == report["checks"]["moe_reduced"]["figures"]["spmd_backend"] == "spmd_types"
    # The page opens with one row per check and its deciding figure.
    html = (tmp_path / "preflight" / "preflight.html").read_text()
    decision = html[html.index('<table class="decision">'):html.index("</table>", html.index('class="decision"'))]
    assert decision.count("<tr>") == 1 + len(report["checks"]) and "see details" not in decision
    assert "36 rope_hf replacements in the planned launch" in decision
    # The Neuron SDK release it checked against, and the fork's ref, on the page and in the printed summary.
    assert "SDK 2.33.0 (" in decision and "torchtitan-neuron.git @ release-2.33" in decision
    capsys.readouterr()
    print_summary(report)
    printed = capsys.readouterr().out
    assert "  install_plan: Neuron SDK 2.33.0 (" in printed
    assert "fork https://github.com/aws-neuron/torchtitan-neuron.git @ release-2.33\n" in printed
    assert f"  fork: {fork} @ release-2.33 = " in printed and f"base {base[:12]} of 2026-08-15 on " in printed
    assert ("  fork_launches: torchtitan 0.3.0 (hf_datasets level), 2 steps each: qwen3_native trained 5.771, "
            "5.747\n") in printed
    assert f"release-2.33 = {report['checks']['fork']['figures']['commit'][:12]}: every name present; base" in decision
    parity = {row["field"]: (row["built"], row["checkpoint"], row["verdict"]) for row in native["parity"]}
    assert parity["rope_theta"] == (5_000_000.0, 5_000_000.0, "match")
    moe = report["checks"]["moe_reduced"]["figures"]
    assert moe["parameters"] == 1_906_330_624 and moe["kernel_replacements"] == {"rope_hf": 4, "moe_grouped_experts": 4}
    hf = {row["field"]: row["verdict"] for row in report["checks"]["train_hf"]["figures"]["parity"]}
    assert hf["max_position_embeddings"].startswith("accepted difference")
    assert report["checks"]["fsdp_plan"]["figures"]["params_per_rank_max"] == 62_851_064
    launches = report["checks"]["launches"]["figures"]
    assert {(launch["stage"], launch["launch"]) for launch in launches} >= {
        ("verify_ranks", "ranks"), ("train_native", "run"), ("train_native", "control"), ("train_native", "plain"),
        ("train_native", "repeat"), ("train_hf", "run"),
        ("moe_reduced", "run"), ("moe_reduced", "plain"), ("kernel_numerics", "stage process (no torchrun)"),
    }
    # kernel_numerics uses the device in the stage's own process, with the environment it sets there: the
    # compile caches and the LNC, nothing of a torchrun launch.
    (numerics,) = [launch for launch in launches if launch["stage"] == "kernel_numerics"]
    # Its script reads its settings from Snakemake: the command a person can run is the stage's own target,
    # with the configuration the preflight checked.
    assert numerics["command"] == ["snakemake", "--cores", "1", "--configfile", str(TRN2),
                                   "results/kernel_numerics/measured.json"]
    assert set(numerics["env"]) == {"TORCH_NEURONX_NEFF_CACHE_DIR", "TORCH_NEURONX_DEBUG_DIR",
                                    "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR", "NEURON_LOGICAL_NC_CONFIG",
                                    "NEURON_RT_VIRTUAL_CORE_SIZE", "NEURON_CC_FLAGS"}
    assert numerics["env"]["TORCH_NEURONX_NEFF_CACHE_DIR"].endswith("neuron/neff-cache")
    assert numerics["env"]["NEURON_LOGICAL_NC_CONFIG"] == numerics["env"]["NEURON_RT_VIRTUAL_CORE_SIZE"] == "2"
    launches = [launch for launch in launches if launch is not numerics]
    for launch in launches:
        assert "--nproc-per-node=64" in launch["command"] and "--local-ranks-filter=0" in launch["command"]
        assert launch["env"]["NEURON_LOGICAL_NC_CONFIG"] == "2" and launch["env"]["NEURON_CC_FLAGS"].endswith("--lnc=2")
    # The benchmark's launches: per recipe and run; compiled ones with the neuron compile backend; a compile
    # cache of their own per measurement, the eager run's too (TorchNeuron compiles in eager mode).
    bench = {launch["launch"]: launch for launch in launches if launch["stage"] == "benchmark"}
    # The native recipe's rope_hf replacement (kernels.train_native) is measured against its plain twin too.
    assert set(bench) == {"train_native eager", "train_native plain", "train_native compiled_cold",
                          "train_native compiled_warm", "moe_reduced eager", "moe_reduced plain"}
    cold = bench["train_native compiled_cold"]
    # Every setting reaches the ranks in the run's TrainerRun file: the command names only the recipe and folder.
    assert cold["command"][-4:-1] == ["--config", "qwen3_native", "--dump_folder"]
    assert cold["run"]["compile_backend"] == "neuron" and cold["run"]["use_checkpoint"] is False
    assert cold["env"]["TORCH_NEURONX_NEFF_CACHE_DIR"].endswith(
        "results/benchmark/runs/train_native/compile_cache/cold/torch_neuronx_neff_cache_dir")
    warm = bench["train_native compiled_warm"]
    assert warm["run"]["compile_backend"] == "neuron"
    assert warm["env"]["TORCH_NEURONX_NEFF_CACHE_DIR"].endswith(
        "results/benchmark/runs/train_native/compile_cache/warm/torch_neuronx_neff_cache_dir")
    assert bench["moe_reduced eager"]["run"]["compile_backend"] is None
    assert bench["moe_reduced eager"]["env"]["TORCH_NEURONX_NEFF_CACHE_DIR"].endswith(
        "results/benchmark/runs/moe_reduced/compile_cache/eager/torch_neuronx_neff_cache_dir")
    # The plain twin too: its step 1 is compared with the eager run's, so neither starts from a warmed cache.
    assert bench["moe_reduced plain"]["env"]["TORCH_NEURONX_NEFF_CACHE_DIR"].endswith(
        "results/benchmark/runs/moe_reduced/compile_cache/plain/torch_neuronx_neff_cache_dir")
    assert "Nothing in this preflight ran on Trainium" in report["nothing_ran_on_trainium"]
    html = (tmp_path / "preflight" / "preflight.html").read_text()
    assert "Nothing in this preflight ran on Trainium" in html and "rope HF on every layer" in html
    assert "stage process (no torchrun)" in html and "results/kernel_numerics/measured.json" in html
    assert json.loads((tmp_path / "preflight" / "preflight.json").read_text())["status"] == "pass"


@pytest.mark.parametrize("overlay, check, message", [
    ({"neuron": {"lnc": 3}}, "config", "3 is not one of [1, 2]"),
    ({"neuron": {"lnc": 1}}, "config",
     "ranks = 64: on the neuron backend it must equal chips x cores_per_chip / lnc = 16 x 8 / 1 = 128"),
    ({"training": {"seq_len": 384}}, "config", "training.seq_len = 384: must be a multiple of 128 x neuron.lnc = 256"),
    ({"ranks": 32}, "config", "ranks = 32: on the neuron backend it must equal chips x cores_per_chip / lnc"),
    ({"training": {"native_flavor": "4B"}}, "train_native",
     "rope_theta: built 1000000.0, checkpoint config.json 5000000.0"),
], ids=["lnc_not_1_or_2", "lnc_1_with_64_ranks", "seq_len_not_256", "ranks_not_64", "unaccepted_theta"])
def test_a_broken_trn2_config_fails_naming_what_is_wrong(tmp_path, overlay, check, message):
    report = run(tmp_path, overlay)
    assert report["status"] == "fail" and check in report["failed"]
    assert message in report["checks"][check]["error"]


def test_a_theta_difference_accepted_with_a_reason_passes(tmp_path):
    # torchtitan's 4B flavor differs from Qwen3-4B-Instruct-2507 in theta and in the context it was built for.
    reason = "the seed recipe trains torchtitan's 4B flavor as it is"
    report = run(tmp_path, {"training": {"native_flavor": "4B", "accepted_differences": {
        "train_native": {"rope_theta": reason, "max_position_embeddings": "40,960 positions cover training.seq_len"},
        "train_hf": {"max_position_embeddings": "set to training.seq_len"}}}})
    assert report["checks"]["train_native"]["status"] == "pass"
    rows = {row["field"]: row["verdict"] for row in report["checks"]["train_native"]["figures"]["parity"]}
    assert rows["rope_theta"] == f"accepted difference: {reason}"


def test_a_torchtitan_missing_a_field_the_recipes_use_fails(tmp_path, monkeypatch):
    missing = api_names.ApiEntry("torchtitan.config", "TrainingConfig", "the recipes set it",
                                 fields=("field_from_the_future",))
    monkeypatch.setattr(api_names, "TORCHTITAN_API", (*api_names.TORCHTITAN_API, missing))
    report = run(tmp_path)
    assert report["failed"] == ["torchtitan_api"]
    assert ("torchtitan.config.TrainingConfig has no field field_from_the_future (the recipes set it)"
            in report["checks"]["torchtitan_api"]["error"])


def test_a_two_node_trn2_config_prints_srun_torchrun_launches_with_the_efa_settings(tmp_path, monkeypatch):
    from qwen3_pilot.backends import FIRST_NODE_OF_ALLOCATION, make_backend
    from qwen3_pilot.tools.preflight.launches import launch_plan
    from qwen3_pilot.tools.preflight.run import load_config

    for key in ("SLURM_JOB_NODELIST", "SLURM_JOB_NUM_NODES", "FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA",
                "FI_EFA_FORK_SAFE"):
        monkeypatch.delenv(key, raising=False)
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump({"nodes": 2}))
    config = load_config([TRN2, tmp_path / "nodes.yaml"])
    assert config["training"]["global_batch_size"] == 128
    launches = launch_plan(config, make_backend(config, str(tmp_path / "cache")), PROJECT,
                           [TRN2, tmp_path / "nodes.yaml"])
    (numerics,) = [launch for launch in launches if launch["stage"] == "kernel_numerics"]
    # kernel_numerics runs on one node in the stage's own process: no srun, no EFA.
    assert not numerics["command"][0].startswith("srun") and not any(key.startswith("FI_") for key in numerics["env"])
    launches.remove(numerics)
    assert len(launches) > 5
    for launch in launches:
        command = " ".join(launch["command"])
        assert command.startswith("srun --ntasks-per-node=1 --kill-on-bad-exit=1 "), command
        assert (f"--nnodes=2 --rdzv-backend=c10d --rdzv-endpoint={FIRST_NODE_OF_ALLOCATION}:29500 "
                "--rdzv-id=qwen3-pilot --nproc-per-node=64") in command
        assert {key: launch["env"][key] for key in ("FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "FI_EFA_FORK_SAFE")} == {
            "FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1"}


def test_under_a_refused_torchtitan_the_checks_that_need_one_say_not_run_without_a_traceback(tmp_path):
    # A fresh interpreter: this one has torchtitan 0.3.0 imported already.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(pre_refactor_torchtitan(tmp_path / "site")), str(PROJECT / "workflow" / "scripts")])}
    result = subprocess.run([sys.executable, "-m", "qwen3_pilot.tools.preflight", "--out", str(tmp_path / "out")],
                            capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 1, result.stderr[-2000:]
    report = json.loads((tmp_path / "out" / "preflight.json").read_text())
    assert report["checks"]["torchtitan_api"]["status"] == "fail"
    for name in ("train_native", "train_hf", "moe_reduced", "fsdp_plan"):
        assert report["checks"][name] == {"status": "not_run", "seconds": 0.0, "error":
                                          "not run: the installed torchtitan is refused (see torchtitan_api)"}, name
    assert report["checks"]["launches"]["status"] == "pass"
    assert "Traceback" not in result.stdout + result.stderr
    assert "  not_run  fsdp_plan: not run: the installed torchtitan is refused" in result.stdout


def test_the_fsdp_plan_uses_plan_world_size_not_the_ranks_of_this_run(tmp_path, monkeypatch):
    from qwen3_pilot import rank_plan
    from qwen3_pilot.tools.preflight.run import fsdp_plan, load_config

    asked = []
    monkeypatch.setattr(rank_plan, "run_plan_subprocess", lambda **kwargs: asked.append(kwargs) or {"fits": True})
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump({"plan": {"world_size": 128}}))
    config = load_config([TRN2, tmp_path / "plan.yaml"])
    assert config["ranks"] == 64
    fsdp_plan(config, tmp_path)
    assert [call["world_size"] for call in asked] == [128]


# ---- the fork before renting: its base on upstream, and the API check against its own torchtitan ----


def commit_all(repo, message: str, date: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_DATE": f"{date}T12:00:00+00:00", "GIT_COMMITTER_DATE": f"{date}T12:00:00+00:00"}
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "add", "-A"], check=True, env=env)
    subprocess.run([*git, "commit", "-q", "-m", message], check=True, env=env)
    return subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()


def rehearsal_fork(tmp_path, torchtitan) -> tuple:
    """An upstream repository whose main holds `torchtitan` (a function that puts a torchtitan package into a
    folder) at a commit of 2026-08-15 and moves on on 2026-08-25, and a fork branched at the first commit
    whose release-2.33 adds a stand-in torchtitan_neuron: (upstream, fork, the base commit)."""
    upstream = tmp_path / "upstream"
    upstream.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "-b", "main", str(upstream)], check=True)
    torchtitan(upstream)
    base = commit_all(upstream, "upstream at the fork's base", "2026-08-15")
    fork = tmp_path / "fork"
    subprocess.run(["git", "clone", "-q", str(upstream), str(fork)], check=True)
    (upstream / "README.md").write_text("upstream moved on\n")
    commit_all(upstream, "upstream after the fork", "2026-08-25")
    subprocess.run(["git", "-C", str(fork), "checkout", "-q", "-b", "release-2.33"], check=True)
    (fork / "torchtitan_neuron").mkdir()
    (fork / "torchtitan_neuron" / "__init__.py").write_text("")
    commit_all(fork, "the fork's own package", "2026-08-20")
    return upstream, fork, base


def installed_torchtitan_link(folder):
    """This venv's torchtitan, as a link the repository commits: the API check finds every name in it."""
    import torchtitan

    (folder / "torchtitan").symlink_to(Path(torchtitan.__file__).parent)


def test_a_fork_clone_is_checked_for_its_base_on_upstream_and_its_own_torchtitans_api(tmp_path, capsys):
    from qwen3_pilot.tools.preflight.fork import fork_base, fork_check
    from qwen3_pilot.tools.preflight.run import print_summary

    upstream, fork, base = rehearsal_fork(tmp_path, installed_torchtitan_link)
    (tmp_path / "work").mkdir()
    figures = fork_check(str(fork), "release-2.33", str(upstream), tmp_path / "work")
    assert (figures["merge_base"], figures["merge_base_date"]) == (base, "2026-08-15")
    assert (figures["fork_commits_since"], figures["upstream_commits_since"]) == (1, 1)
    assert figures["api"] == {user: "every name present" for user in titan_api.missing_by_user("neuron")}
    # The given clone is only read: nothing fetched into it.
    refs = subprocess.run(["git", "-C", str(fork), "for-each-ref"], capture_output=True, text=True).stdout
    assert "preflight" not in refs
    print_summary({"status": "pass", "seconds": 1.0, "nothing_ran_on_trainium": "", "checks": {
        "fork": {"status": "pass", "figures": figures}}})
    assert (f"  fork: {fork} @ release-2.33 = {figures['commit'][:12]}; base {base[:12]} of 2026-08-15 on "
            f"{upstream} (1 fork commits since, 1 upstream)") in capsys.readouterr().out
    # Without upstream's history the base is unknown, said with why (fork_check then goes on to the API check, as
    # above: its subprocess is not started a second time here).
    unknown = fork_base(tmp_path / "work" / "fork", str(tmp_path / "no-such-upstream"))
    assert unknown["merge_base"] is None and unknown["why"].startswith(f"upstream {tmp_path / 'no-such-upstream'} "
                                                                       "not fetched: git fetch")


def test_a_fork_on_a_torchtitan_from_before_the_config_refactor_fails_the_check_naming_it(tmp_path):
    from qwen3_pilot.tools.preflight.fork import ForkError, fork_check

    upstream, fork, _ = rehearsal_fork(tmp_path, pre_refactor_torchtitan)
    (tmp_path / "work").mkdir()
    with pytest.raises(ForkError, match=r"the fork at release-2.33 \([0-9a-f]{12}\): the installed torchtitan "
                                             r"\(torchtitan from .*\) predates upstream's config refactor"):
        fork_check(str(fork), "release-2.33", str(upstream), tmp_path / "work")


def finished_cpu_run(folder: Path) -> Path:
    """A folder holding what fork_launches reads of a finished cpu run: each training stage's recorded launch."""
    from qwen3_pilot.paths import RunFolder
    from qwen3_pilot.recipe_registry import RECIPES

    for recipe in RECIPES:
        record = RunFolder(folder).launch_record(recipe.stage, "run")
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text("{}")
    return folder


def test_the_forks_torchtitan_trains_each_recipes_recorded_launch_with_the_clone_first_on_the_path(tmp_path):
    """fork_launches relaunches every recipe's recorded launch of the finished cpu run for 2 steps with the fork's
    clone as the torchtitan (titan_compat's relaunch, tested for real in tests/tools/test_titan_compat.py, stands
    in here); its API probe runs for real, in the clone's torchtitan."""
    from qwen3_pilot.recipe_registry import RECIPES
    from qwen3_pilot.tools import titan_compat
    from qwen3_pilot.tools.preflight.fork import ForkError, fork_launches

    _, fork, _ = rehearsal_fork(tmp_path / "repos", installed_torchtitan_link)
    with pytest.raises(ForkError, match=rf"^{tmp_path / 'empty'}: no recorded launch for train_native, train_hf, "
                                        r"moe_reduced \(results/<stage>/run/launch.json\): run the cpu pipeline here "
                                        r"first \(make report\)"):
        fork_launches(fork, tmp_path / "empty", tmp_path / "scratch")

    run = finished_cpu_run(tmp_path / "run")
    relaunched, probed = [], []

    def train(workdir, torchtitan, recipe, steps, scratch):
        relaunched.append((workdir, torchtitan.path, recipe.stage, steps))
        return {"works": True, "why": "trained 5.000, 4.900"}

    def probe(torchtitan):
        probed.append(real_probe(torchtitan))
        return probed[-1]

    real_probe = titan_compat.api_probe
    # Handed in, not patched into titan_compat: a test body in another thread may be using it meanwhile.
    figures = fork_launches(fork, run, tmp_path / "scratch", probed=probe, trained=train)
    assert relaunched == [(run, fork, recipe.stage, 2) for recipe in RECIPES]
    assert figures["steps"] == 2 and figures["level"] == "hf_datasets"
    assert figures["recipes"] == {recipe.config_function: "trained 5.000, 4.900" for recipe in RECIPES}

    # A recipe the fork's torchtitan cannot train fails the check, named with why (the same probe's answer: its
    # subprocess is not started a second time).
    def fails_moe(workdir, torchtitan, recipe, steps, scratch):
        return ({"works": False, "why": "the trainer failed: KeyError: 'seq_len'"} if recipe.stage == "moe_reduced"
                else {"works": True, "why": "trained"})

    with pytest.raises(ForkError, match=r"the fork's torchtitan \(.*\) does not train qwen3_moe_reduced: the "
                                        r"trainer failed: KeyError: 'seq_len'$"):
        fork_launches(fork, run, tmp_path / "scratch", probed=lambda torchtitan: probed[0], trained=fails_moe)


# A fork whose Qwen3 recipe brings its own parallelize function and SPMD backend.
FORK_RECIPE = """
import dataclasses
from torchtitan.models.qwen3.config_registry import qwen3_32b

def fork_parallelize(model, **kwargs):
    return model

def qwen3_8b_tp4_fsdp16_sac():
    config = qwen3_32b()
    config.model_spec = dataclasses.replace(config.model_spec, parallelize_fn=fork_parallelize)
    config.parallelism.spmd_backend = "partial_dtensor"
    return config
"""


def test_on_neuron_the_recipes_keep_the_forks_parallelize_function_and_spmd_backend(tmp_path, monkeypatch):
    from qwen3_pilot.backends import make_backend
    from qwen3_pilot.tools.preflight.recipe_checks import (
        MOE_MODEL,
        checkpoint_stand_in,
        moe_check,
        native_check,
        published_config,
        stage_recipes,
    )
    from qwen3_pilot.tools.preflight.run import load_config

    fake_fork(monkeypatch, FORK_RECIPE)
    config = load_config([TRN2])
    dense = published_config(DEFAULT_MODEL_CONFIGS, config["weights"]["repo_id"].split("/")[-1])
    recipes = stage_recipes(config, make_backend(config, str(tmp_path / "cache")), checkpoint_stand_in(tmp_path, dense),
                            tmp_path)
    native = native_check(recipes["train_native"], config["training"]["accepted_differences"]["train_native"])
    assert native["base"] == "torchtitan_neuron.models.qwen3.config_registry:qwen3_8b_tp4_fsdp16_sac"
    assert native["parallelize_fn"] == "torchtitan_neuron.models.qwen3.config_registry.fork_parallelize"
    assert native["spmd_backend"] == "partial_dtensor" and native["parameters"] == 4_022_468_096
    # The reduced MoE's trainer takes the same base (its SPMD backend); its model spec stays the MoE one.
    moe = moe_check(recipes["moe_reduced"], config, published_config(DEFAULT_MODEL_CONFIGS, MOE_MODEL))
    assert moe["spmd_backend"] == "partial_dtensor"
    assert moe["parallelize_fn"] == "torchtitan.models.qwen3.parallelize.parallelize_qwen3"
