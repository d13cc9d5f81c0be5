"""The training stages under Snakemake when something goes wrong: a bad checkpoint, a killed run, a CPU
workaround taken away. Each test works on a copy of the completed run and reruns one stage."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys

import pytest
from conftest import (
    AHEAD_ENV,
    SNAKEMAKE,
    metric_lines,
    output,
    rank_processes,
    record_fail_fast_run,
    released_once_signalled,
    run_snakemake,
    started_ahead,
    stopped,
    wait_for_ends,
    wait_for_steps,
)

from qwen3_pilot.training import read_steps, relaunch
from qwen3_pilot.unlock import workflow_processes

pytestmark = [pytest.mark.e2e, pytest.mark.torchrun]

CHECKPOINT = "results/fetch_weights/checkpoint"


# The training job itself, not only the judge of its recorded figures (the target's job).
FORCE_TRAINING = ("--forcerun", "train")


def rerun(ws, stage, *args):
    """The stage's training forced under Snakemake (a started_ahead body: with the session's environment)."""
    return run_snakemake(ws, "--cores", "2", f"results/{stage}/summary.json", *FORCE_TRAINING, *args, env=AHEAD_ENV)


def step1_loss(ws, stage):
    return json.loads((ws / "results" / stage / "summary.json").read_text())["figures"]["gate"]["step1_loss_loaded"]


def edit_safetensors(path, change):
    from safetensors.torch import load_file, save_file

    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def as_fetched(ws, path):
    """Record an edited checkpoint file in fetch_weights' summary and manifest (what the training stages read), as
    if the fetch had brought it: these tests feed the trainer a bad checkpoint, not one changed behind the fetch's
    back (the custody check's case)."""
    from qwen3_pilot.artifacts import sha256_file, write_recorded_json

    relative = path.relative_to(ws).as_posix()
    for record_path in (ws / "results" / "fetch_weights" / name for name in ("summary.json", "manifest.json")):
        record = json.loads(record_path.read_text())
        for artifact in record["artifacts"]:
            if artifact["path"] == relative:
                artifact["sha256"], artifact["bytes"] = sha256_file(path), path.stat().st_size
        write_recorded_json(record_path, record)


def first_key(path, suffix):
    from safetensors import safe_open

    with safe_open(path, "pt") as handle:
        return next(k for k in handle.keys() if k.endswith(suffix))


def failed_relaunch(ws, stage, tmp_path, *, recipe=None, env=None, ranks_per_node=None) -> str:
    """The stage's recorded trainer launch again for 1 step, by hand (training.relaunch) with `recipe` over its
    recipe and `env` over its environment, expected to fail: what it printed and the first rank error. The
    Snakemake-level failure of each kind is tested once below (a wrong shape, a killed run, a failed gate).
    `ranks_per_node=1` for a failure that each rank meets on its own: half the start-up of two ranks."""
    launch = relaunch(ws, stage, "run", tmp_path / "relaunch", added_env=env, ranks_per_node=ranks_per_node,
                      recipe_changes={"steps": 1, "warmup_steps": 1, **(recipe or {})}, base_env=AHEAD_ENV)
    assert launch.returncode != 0, launch.output()[-3000:]
    return launch.output() + (launch.rank_error() or "")


@started_ahead(once_trained=True)
def test_a_tensor_of_the_wrong_shape_fails_the_stage_and_is_named(copy_of_run, _):
    weights = copy_of_run / CHECKPOINT / "model.safetensors"
    key = first_key(weights, "mlp.gate_proj.weight")
    shapes = {}

    def shorten(tensors):
        shapes["current"] = tensors[key].shape
        tensors[key] = tensors[key][:-8].clone()
        shapes["saved"] = tensors[key].shape

    edit_safetensors(weights, shorten)
    as_fetched(copy_of_run, weights)
    record_fail_fast_run(copy_of_run, AHEAD_ENV)  # run for real, it passed this change (its own tiny weights)
    result = rerun(copy_of_run, "train_native")
    assert result.returncode != 0
    assert "TrainingError: train_native (fetched weights)" in output(result)
    expected = f"Size mismatch between saved {shapes['saved']} and current: {shapes['current']} for {key}"
    assert expected in output(result), output(result)[-3000:]


def test_a_missing_tensor_fails_the_launch_and_is_named(trained_run, tmp_path):
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(trained_run / CHECKPOINT, checkpoint)
    key = first_key(checkpoint / "model.safetensors", "self_attn.k_norm.weight")
    edit_safetensors(checkpoint / "model.safetensors", lambda t: t.pop(key))
    text = failed_relaunch(trained_run, "train_hf", tmp_path, recipe={"checkpoint": str(checkpoint)}, ranks_per_node=1)
    assert key in text, text[-3000:]


def test_weights_without_the_pretraining_fail_the_loaded_weights_gate(trained_run, tmp_path):
    """The gate on real runs: the recorded launch again for 1 step, on one rank, on weights that load but carry no
    pretraining (small random values, as an uninformed model's) is not min_gap below the recorded random-init
    control, so the gate that passed the fetched weights fails it."""
    import torch

    from qwen3_pilot.stages.train_judging import loaded_weights_gate
    from qwen3_pilot.training import read_steps

    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(trained_run / CHECKPOINT, checkpoint)
    generator = torch.Generator().manual_seed(0)
    edit_safetensors(checkpoint / "model.safetensors", lambda tensors: tensors.update(
        {key: torch.randn(value.shape, generator=generator).to(value.dtype) * 0.02 for key, value in tensors.items()}))
    launch = relaunch(trained_run, "train_native", "run", tmp_path / "relaunch", ranks_per_node=1,
                      recipe_changes={"steps": 1, "warmup_steps": 1, "checkpoint": str(checkpoint)}, base_env=AHEAD_ENV)
    assert launch.returncode == 0, launch.output()[-3000:]
    [step] = read_steps(tmp_path / "relaunch" / "run" / "metrics.jsonl")
    judged = json.loads((trained_run / "results" / "train_native" / "summary.json").read_text())["figures"]["gate"]
    low, high = judged["control_band"]
    thresholds = {"min_gap": judged["min_gap"], "control_below_ln_vocab": judged["ln_vocab"] - low,
                  "control_above_ln_vocab": high - judged["ln_vocab"]}
    vocab = round(math.exp(judged["ln_vocab"]))
    _, passed = loaded_weights_gate(judged["step1_loss_loaded"], judged["step1_loss_random_init"], vocab, thresholds)
    figures, problems = loaded_weights_gate(step["loss"], judged["step1_loss_random_init"], vocab, thresholds)
    assert passed == [] and len(problems) == 1 and "the weights did not load" in problems[0], (figures, problems)


@started_ahead(once_trained=True)
def test_a_native_model_with_another_rope_theta_fails_before_training(copy_of_run, _):
    config_path = copy_of_run / CHECKPOINT / "config.json"
    config = json.loads(config_path.read_text())
    config["rope_parameters"]["rope_theta"] = 5_000_000
    config.pop("rope_theta", None)
    config_path.write_text(json.dumps(config))
    as_fetched(copy_of_run, config_path)
    # torchtitan's registered debug flavor keeps its own theta (1e6), as the 4B flavor does for Qwen3-4B-2507.
    overlay = copy_of_run / "config" / "test.yaml"
    overlay.write_text(overlay.read_text() + "training:\n  native_flavor: debugmodel\n")
    record_fail_fast_run(copy_of_run, AHEAD_ENV)  # run for real, it passed this change (its own tiny weights)
    result = rerun(copy_of_run, "train_native")
    assert result.returncode != 0
    text = output(result)
    assert "the model differs from the checkpoint's config.json" in text
    assert "rope_theta: built 1000000.0, checkpoint config.json 5000000.0" in text, text[-3000:]
    parity = json.loads((copy_of_run / "results" / "train_native" / "parity.json").read_text())
    assert any(row["field"] == "rope_theta" and row["verdict"] == "MISMATCH" for row in parity["rows"])


# What each CPU workaround in backends/cpu.py prevents: skipping it brings the error back, on one rank where one
# meets it (FSDP reduce-scatters gradients only across two or more: fsdp_sum's error needs the recorded two).
WORKAROUNDS = [
    ("train_native", "device", "Found no NVIDIA driver", 1),
    ("train_native", "memory", "get_device_name", 1),
    ("train_native", "barrier", "BarrierOptions", 1),
    ("train_native", "fsdp_sum", "PREMUL_SUM", None),
]


@pytest.mark.parametrize("stage, workaround, error, ranks_per_node", WORKAROUNDS,
                         ids=[w for _, w, _, _ in WORKAROUNDS])
def test_each_cpu_workaround_is_needed(trained_run, tmp_path, stage, workaround, error, ranks_per_node):
    text = failed_relaunch(trained_run, stage, tmp_path, env={"QWEN3_PILOT_SKIP_CPU_WORKAROUNDS": workaround},
                           ranks_per_node=ranks_per_node)
    assert error in text, text[-3000:]


@started_ahead(once_trained=True, in_place=True)
def test_flex_attention_in_the_hf_recipe_fails_on_cpu(trained_run, scratch):
    """Why training.attention is sdpa: torchtitan's transformers backend routes attention through flex, whose own
    device check refuses inputs that need gradients on CPU. Relaunched with torch.compile off (TORCHDYNAMO_DISABLE):
    with it on, inductor's C++ builds come before the check, and the relaunch took 27.7 CPU-seconds here against
    8.1 with it off, for the same message."""
    text = failed_relaunch(trained_run, "train_hf", scratch, recipe={"attention": "flex"}, ranks_per_node=1,
                           env={"TORCHDYNAMO_DISABLE": "1"})
    assert "FlexAttention does not support backward on CPU" in text, text[-3000:]


@pytest.mark.parametrize("module, named", [
    ("moe.*experts*", "2 modules match in layer 0: layers.0.moe.routed_experts, "
                      "layers.0.moe.routed_experts.inner_experts"),
    ("moe.experts_renamed", "no module matches in layer(s) 0, 1, 2, 3"),
], ids=["two_in_a_layer", "none_in_a_layer"])
def test_a_replacement_pattern_that_is_not_one_per_layer_fails_moe_reduced(trained_run, tmp_path, module, named):
    recipe = json.loads((trained_run / "results" / "moe_reduced" / "recipe.json").read_text())
    rules = [{**rule, "module": module} if rule["kernel"] == "moe_grouped_experts" else rule
             for rule in recipe["replacements"]]
    assert rules != recipe["replacements"]
    text = failed_relaunch(trained_run, "moe_reduced", tmp_path, recipe={"replacements": rules}, ranks_per_node=1)
    assert named in text, text[-3000:]


@started_ahead(once_trained=True, in_place=True)
def test_rope_replaced_in_the_native_recipe_trains_like_the_plain_recipe(trained_run, scratch):
    """The native recipe's launch again with the rope_hf replacement (trn2's setting): one replacement per
    layer in its log, and the losses of the shared run's plain recipe, from the same weights and batches. The
    stage's own comparison with its plain twin is the moe_reduced stage's, in the shared run."""
    from qwen3_pilot.training import read_steps, replacement_check

    moe_recipe = json.loads((trained_run / "results" / "moe_reduced" / "recipe.json").read_text())
    rope = [rule for rule in moe_recipe["replacements"] if rule["kernel"] == "rope_hf"]  # kernels.rules.rope_hf
    launch = relaunch(trained_run, "train_native", "run", scratch / "relaunch",
                      recipe_changes={"replacements": rope}, base_env=AHEAD_ENV)
    assert launch.returncode == 0, launch.output()[-3000:]
    # What the stage checks in its launch log: one replacement per layer, none elsewhere.
    checked = replacement_check("train_native", launch, rope, n_layers=2)
    assert checked["per_kernel"]["rope_hf"]["modules"] == ["layers.0.attention.rope", "layers.1.attention.rope"]
    replaced = [step["loss"] for step in read_steps(scratch / "relaunch" / "run" / "metrics.jsonl")]
    plain = [step["loss"] for step in json.loads(
        (trained_run / "results" / "train_native" / "summary.json").read_text())["figures"]["steps"]]
    assert len(replaced) == 10 and max(abs(a - b) for a, b in zip(replaced, plain, strict=True)) <= 1e-4


def start_training(ws, run_dir) -> subprocess.Popen:
    """Snakemake forcing train_native in its own process group (as a terminal runs a foreground command, so
    that Ctrl-C is SIGINT to the group), once the run has logged `steps` steps: mid-training."""
    shutil.rmtree(run_dir, ignore_errors=True)  # so that the metrics watched are the new run's
    command = [SNAKEMAKE, "--cores", "2", "results/train_native/summary.json", *FORCE_TRAINING, "--configfile",
               "config/test.yaml"]
    # SIGINT at its default, as under a terminal: a suite started in the background (`make test &`) ignores it, and
    # Snakemake and its jobs would inherit that (coreutils' env resets it before the exec; no preexec_fn in a
    # process with threads).
    return subprocess.Popen(["env", "--default-signal=INT", *command], cwd=ws, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, env=AHEAD_ENV)


@started_ahead(once_trained=True)
def test_a_training_stage_killed_or_interrupted_ends_with_its_ranks_and_says_so(copy_of_run, _):
    """Two ways a training stage's run ends early, on a copy of the shared run once its training stages are done
    (started then, beside the rest of the run): torchrun killed mid-training (SIGKILL: the stage says so, fails,
    and keeps its log); Snakemake killed outright (the stage, torchrun and the ranks end with it, before training to
    the end; `make unlock`). Ctrl-C, and the plain command after it: the next test."""
    run_dir = copy_of_run / "results" / "train_native" / "run"
    log = copy_of_run / "logs" / "train_native" / "train_native.log"

    snakemake = start_training(copy_of_run, run_dir)
    wait_for_steps(snakemake, run_dir, 2)
    os.kill(int((run_dir / "launcher.pid").read_text()), signal.SIGKILL)  # torchrun, mid-training
    stdout, _ = snakemake.communicate(timeout=300)
    assert snakemake.returncode != 0
    assert "torchrun was killed by signal 9" in stdout, stdout[-3000:]
    assert "torchrun was killed by signal 9" in log.read_text()

    # Snakemake itself killed outright (a closed terminal, the OOM killer): the stage, torchrun and the ranks end
    # with it; the next command stops on the lock it left, naming the one command that clears it.
    # The ranks are stopped mid-training, so that a step can only follow the kill if no signal reaches them (a loaded
    # machine's delay between the kill and their end decides nothing): let go once signalled, they must end.
    snakemake = start_training(copy_of_run, run_dir)
    wait_for_steps(snakemake, run_dir, 1)
    ranks = rank_processes(copy_of_run)
    assert len(ranks) == 2, "no rank found while training"
    stopped(ranks)
    steps_logged = metric_lines(run_dir)
    os.kill(snakemake.pid, signal.SIGKILL)
    released_once_signalled(ranks)
    snakemake.communicate(timeout=60)  # returns once every process holding its output has ended
    wait_for_ends([pid for pid, _ in workflow_processes(copy_of_run)])
    assert metric_lines(run_dir) <= steps_logged < 10, "the ranks trained on after Snakemake was killed"
    locked = run_snakemake(copy_of_run, "--cores", "1", "results/train_native/summary.json", env=AHEAD_ENV)
    assert locked.returncode != 0 and "run `make unlock`" in output(locked), output(locked)[-3000:]
    unlocked = subprocess.run([sys.executable, "-m", "qwen3_pilot.unlock"], cwd=copy_of_run, capture_output=True,
                              text=True, timeout=120, env=AHEAD_ENV)
    assert unlocked.returncode == 0, unlocked.stderr[-3000:]
    assert workflow_processes(copy_of_run) == []
    # Snakemake emptied the job's log when it ran the job again; the killed run's log was kept beside it.
    kept = [path.read_text() for path in log.parent.glob("train_native.failed-*.log")]
    assert any("torchrun was killed by signal 9" in text for text in kept), kept


@started_ahead(longest=True)
def test_an_interrupted_training_then_the_plain_command_terminated_and_again_completes_from_the_fetched_weights(
        copy_of_run, tmp_path):
    """Snakemake interrupted mid-training (Ctrl-C: the ranks end with it); the README's plain command, resuming
    that run (its folder holding a checkpoint, what torchtitan would otherwise resume from), terminated (SIGTERM:
    it finishes the running job and exits clean); then the plain command completes the run, the training having run
    from the fetched weights. Killed runs: the test above. A failed gate's report: tests/e2e/test_reruns.py."""
    clean_loss = step1_loss(copy_of_run, "train_native")
    run_dir = copy_of_run / "results" / "train_native" / "run"
    saved_step = tmp_path / "step-10"
    shutil.copytree(run_dir / "checkpoint" / "step-10", saved_step)

    snakemake = start_training(copy_of_run, run_dir)
    wait_for_steps(snakemake, run_dir, 1)
    ranks = rank_processes(copy_of_run)
    assert len(ranks) == 2, "no rank found while training"
    stopped(ranks)
    steps_logged = metric_lines(run_dir)
    os.killpg(snakemake.pid, signal.SIGINT)
    released_once_signalled(ranks)  # the ranks end with the interrupt, not after training on
    assert metric_lines(run_dir) <= steps_logged < 10, "the ranks trained on after the interrupt"
    snakemake.communicate(timeout=120)

    shutil.rmtree(run_dir)  # the metrics watched below are the next run's
    shutil.copytree(saved_step, run_dir / "checkpoint" / "step-10")
    # The README's own command, with no --rerun-incomplete: the workflow profile resumes the interrupted job. A
    # second Snakemake started on the folder while it trains is refused by Snakemake's lock (and told nothing
    # about `make unlock`: the lock's holder is alive). Then the first is terminated (SIGTERM: `kill`, a
    # session's end): Snakemake's own graceful exit lets the running job finish and starts no other; nothing of
    # the run is left, nor its lock. (Ctrl-C, above, is the way to stop at once.)
    plain_command = [SNAKEMAKE, "--cores", "1", "results/report.html", "--configfile", "config/test.yaml"]
    first = subprocess.Popen(plain_command, cwd=copy_of_run, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env=AHEAD_ENV)
    wait_for_steps(first, run_dir, 1)
    second = run_snakemake(copy_of_run, "--cores", "1", "results/report.html", env=AHEAD_ENV)
    assert second.returncode != 0 and "Directory cannot be locked" in output(second), output(second)[-3000:]
    assert "make unlock" not in output(second)
    os.kill(first.pid, signal.SIGTERM)
    stdout, _ = first.communicate(timeout=600)
    assert "Will exit after finishing currently running jobs" in stdout, stdout[-3000:]
    assert len(read_steps(run_dir / "metrics.jsonl")) == 10, stdout[-3000:]  # the training ran to its end
    assert "localrule judge:" not in stdout, stdout[-3000:]  # no job started after it
    assert workflow_processes(copy_of_run) == []
    locks = copy_of_run / ".snakemake" / "locks"
    assert not (locks.is_dir() and any(locks.iterdir())), list(locks.iterdir())

    # The plain command again completes the run: the training the terminated one finished is not redone.
    finished = run_snakemake(copy_of_run, "--cores", "1", "results/report.html", env=AHEAD_ENV)
    assert finished.returncode == 0, output(finished)[-3000:]
    assert "rule train:" not in output(finished), output(finished)[-3000:]
    good = json.loads((copy_of_run / "results" / "report.json").read_text())
    assert not good["failed_run"] and good["status"] == "pass", good["status"]
    assert {s["stage"]: s["status"] for s in good["stages"]}["train_native"] == "pass"
    assert not (copy_of_run / "results" / "failures" / "train_native.json").exists()
    assert step1_loss(copy_of_run, "train_native") == pytest.approx(clean_loss, abs=1e-6)


def test_a_byte_changed_after_its_stage_recorded_it_fails_the_consumer_and_verify(copy_of_run):
    from qwen3_pilot.artifacts import sha256_file
    from qwen3_pilot.audit import verify

    corpus = copy_of_run / "results" / "fetch_corpus" / "c4_test" / "data.json"
    recorded = sha256_file(corpus)
    data = bytearray(corpus.read_bytes())
    data[100] ^= 0x01
    corpus.write_bytes(bytes(data))
    # Snakemake does not see a change inside a directory() output: the stage is rerun by hand, as a user would.
    result = rerun(copy_of_run, "train_native")
    assert result.returncode != 0
    assert (f"results/fetch_corpus/c4_test/data.json: fetch_corpus recorded sha256 {recorded}, the file now has "
            f"{sha256_file(corpus)}") in output(result), output(result)[-3000:]
    lines, ok = verify(copy_of_run / "results" / "report.json", copy_of_run / "signoffs" / "signoffs.jsonl")
    assert not ok and any("CHANGED results/fetch_corpus/c4_test/data.json" in line for line in lines)


@started_ahead(longest=True)
def test_after_a_transformers_pin_change_the_report_lists_reruns_with_reasons_and_moved_figures(copy_of_run, _):
    """The report against the last approved run after a transformers pin change. No second transformers is
    installed here, so the pin is respelled to one that still admits the installed 5.16.0 (==5.16): Snakemake
    sees the same params change that a bump makes, and reruns what a bump reruns."""
    from qwen3_pilot.audit import signoff

    signed = signoff(copy_of_run / "results" / "report.json", "Ada", "approve", "baseline")
    pins = copy_of_run / "workflow" / "envs" / "cpu.txt"
    pins.write_text(pins.read_text().replace("transformers==5.16.0", "transformers==5.16"))

    result = run_snakemake(copy_of_run, "--cores", "2", "results/report.html", env=AHEAD_ENV)
    assert result.returncode == 0, output(result)[-3000:]
    changes = json.loads((copy_of_run / "results" / "report.json").read_text())["changes"]
    runs = changes["invocation"]
    # fail_fast launches every recipe, the Transformers-backend one too; it passes the same checks, so the stages of
    # the other recipes stay as they were.
    assert runs["ran"] == ["pin_env", "fail_fast", "train_hf", "compare_recipes", "export_reload"]
    assert {"train_native", "kernel_numerics", "moe_reduced", "verify_ranks", "fetch_weights"} <= set(runs["reused"])
    assert changes["headline"].startswith("pin_env, fail_fast, train_hf, compare_recipes, export_reload reran; ")
    assert any(r.startswith("pin_package[transformers]: Params have changed since last execution")
               for r in runs["stages"]["pin_env"]["reasons"])
    # Both jobs of the stage, each with its reason: its training (the new stamp), its judge (the new record).
    trained = next(r for r in runs["stages"]["train_hf"]["reasons"] if r.startswith("train[train_hf]: "))
    assert "results/pin_env/packages/transformers.json" in trained, runs["stages"]["train_hf"]["reasons"]
    assert any(r.startswith("judge[train_hf]: ") for r in runs["stages"]["train_hf"]["reasons"])
    assert changes["baseline"]["sha256"] == signed["report_sha256"]
    against = changes["against_baseline"]
    assert {"what": "transformers (pinned)", "before": "==5.16.0", "now": "==5.16"} in against["environment"]
    assert against["stages"]["train_hf"]["timing_figures_moved"]  # it ran again: its step times are new
    native = against["stages"]["train_native"]
    assert not native["figures_moved"] and not native["timing_figures_moved"] and not native["artifacts_changed"]
    html = (copy_of_run / "results" / "report.html").read_text()
    assert "Changes since the baseline" in html and "pin_package[transformers]: Params have changed" in html
    assert not (copy_of_run / "results" / "invocation.json").exists()
