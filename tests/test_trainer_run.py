"""The run a stage asks its ranks for (trainer_run.TrainerRun): one file both sides read the same way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import backend_config

from qwen3_pilot.backends import make_backend
from qwen3_pilot.trainer_run import TrainerRun, TrainerRunError
from qwen3_pilot.training import control_run, trainer_launch, trainer_run

TRAINING = {"steps": 10, "seq_len": 256, "local_batch_size": 1, "global_batch_size": 2, "seed": 0, "lr": 1e-3,
            "warmup_steps": 1, "mixed_precision_param": "float32", "export_dtype": "float32", "native_flavor": None,
            "attention": "sdpa", "comm_init_timeout_s": 300, "comm_train_timeout_s": 100,
            "accepted_differences": {"train_hf": ["max_position_embeddings"]}}
ROPE = {"kernel": "rope_hf", "layers": "*", "module": "attention.rope"}


def hf_run(tmp_path) -> TrainerRun:
    backend = make_backend(backend_config("cpu", 2), str(tmp_path / "cache"))
    return trainer_run(stage="train_hf", backend=backend, checkpoint=tmp_path / "ckpt", corpus_dir=tmp_path / "corpus",
                       dataset="c4_test", training=TRAINING, peak_flops_per_rank=1e10,
                       parity_path=tmp_path / "parity.json", replacements=[ROPE])


def test_a_run_reads_back_as_written(tmp_path):
    run = hf_run(tmp_path)
    run.write(tmp_path / "recipe.json")
    assert TrainerRun.read(tmp_path / "recipe.json") == run
    assert run.accepted_differences == ("max_position_embeddings",) and run.replacements == (ROPE,)
    assert run.checkpoint == str((tmp_path / "ckpt").resolve())  # the ranks run elsewhere: absolute paths


def test_the_control_is_the_same_run_on_random_init_for_one_step(tmp_path):
    run = hf_run(tmp_path)
    control = control_run(run)
    assert (control.use_checkpoint, control.steps) == (False, 1)
    assert control.replace(use_checkpoint=True, steps=run.steps) == run  # nothing else differs


@pytest.mark.parametrize("change, message", [
    (lambda values: values.update(training_steps=3), r"unknown keys \['training_steps'\], missing keys \[\]"),
    (lambda values: values.pop("seq_len"), r"unknown keys \[\], missing keys \['seq_len'\]"),
])
def test_a_file_of_another_shape_is_refused_naming_the_key(tmp_path, change, message):
    path = tmp_path / "recipe.json"
    hf_run(tmp_path).write(path)
    values = json.loads(path.read_text())
    change(values)
    path.write_text(json.dumps(values))
    with pytest.raises(TrainerRunError, match=rf"{path}: not a trainer run this code reads: {message}"):
        TrainerRun.read(path)


def test_the_launch_command_carries_no_setting_only_the_recipe_function_and_folder(tmp_path):
    backend = make_backend(backend_config("cpu", 2), str(tmp_path / "cache"))
    command, env = trainer_launch(backend, 2, "qwen3_hf", tmp_path / "recipe.json", tmp_path / "run")
    tail = command[command.index("qwen3_pilot.titan.in_ranks.train_entry") + 1:]
    assert tail == ["--module", "qwen3_pilot.titan.in_ranks.recipes", "--config", "qwen3_hf", "--dump_folder",
                    str(tmp_path / "run")]
    assert Path(env["QWEN3_PILOT_RECIPE"]) == (tmp_path / "recipe.json").resolve()


def test_a_relaunch_runs_the_recorded_launch_into_scratch_with_its_changes(tmp_path):
    """training.relaunch: the recorded command and environment again, the dump folder, rank logs and the files
    the ranks write moved to the scratch folder, the recipe changes and added environment over the recorded
    ones, and torchrun's ranks per node replaced when asked (a one-rank failure case)."""
    from qwen3_pilot import training
    from qwen3_pilot.paths import RunFolder

    backend = make_backend(backend_config("cpu", 2), str(tmp_path / "cache"))
    stage_dir = tmp_path / "results" / "train_hf"
    stage_dir.mkdir(parents=True)
    hf_run(tmp_path).write(stage_dir / "recipe.json")
    command, env = trainer_launch(backend, 2, "qwen3_hf", stage_dir / "recipe.json", stage_dir / "run",
                                  rank_log_dir=tmp_path / "logs" / "ranks")
    record = RunFolder(tmp_path).launch_record("train_hf", "run")
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"command": command, "env": {**env, "KEPT": "1"}}))
    launched = {}

    def launcher(command, env, **kwargs):
        launched.update(command=command, env=env, **kwargs)
        return "launched"

    scratch = tmp_path / "scratch"
    assert training.relaunch(tmp_path, "train_hf", "run", scratch, recipe_changes={"steps": 1},
                             added_env={"ADDED": "2"}, ranks_per_node=1, launcher=launcher) == "launched"
    assert launched["command"][launched["command"].index("--dump_folder") + 1] == str(scratch / "run")
    assert f"--log-dir={scratch / 'ranks'}" in launched["command"] and "--nproc-per-node=1" in launched["command"]
    assert "--nproc-per-node=2" not in launched["command"]
    assert (launched["env"]["KEPT"], launched["env"]["ADDED"]) == ("1", "2")
    # In the workflow's folder, where the recorded command's relative paths point, without changing this process's.
    assert launched["cwd"] == tmp_path and Path.cwd() != tmp_path
    relaunched = TrainerRun.read(Path(launched["env"]["QWEN3_PILOT_RECIPE"]))
    assert relaunched.steps == 1 and relaunched.parity_path == str(scratch / "parity.json")
    assert relaunched.replace(steps=10, parity_path=str((tmp_path / "parity.json").resolve())) == hf_run(tmp_path)
    training.relaunch(tmp_path, "train_hf", "run", scratch, launcher=launcher)  # ranks per node as recorded
    assert "--nproc-per-node=2" in launched["command"]


def test_a_failed_launch_is_never_explained_by_an_earlier_launchs_parity_table(tmp_path, monkeypatch):
    """The table an earlier launch into the same stage folder left (here naming a rope_theta difference) is gone
    before the next launch: its failure, with no table of its own, says only what this launch recorded."""
    from qwen3_pilot import training
    from qwen3_pilot.launch import Launch

    run = hf_run(tmp_path)
    parity = Path(run.parity_path)
    parity.write_text(json.dumps({"problems": ["rope_theta: built 1.0, checkpoint config.json 5.0"]}))
    monkeypatch.setattr(training, "launch", lambda *args, **kwargs: Launch([], {}, 1, 1.0, log_path=tmp_path / "log"))
    backend = make_backend(backend_config("cpu", 2), str(tmp_path / "cache"))
    with pytest.raises(training.TrainingError) as failed:
        training.launch_and_read("train_hf", backend, run, config_function="f", recipe_path=tmp_path / "r.json",
                                 run_dir=tmp_path / "run", log_path=tmp_path / "log")
    assert "no rank recorded an error" in str(failed.value) and "rope_theta" not in str(failed.value)
    assert not parity.exists()
