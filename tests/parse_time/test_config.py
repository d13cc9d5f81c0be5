"""Bad configuration stops the run at parse time, before any job starts, with the key and value named."""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from conftest import PROJECT, default_config, output, planned_jobs, run_snakemake
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from qwen3_pilot.parse_time.config import (
    ConfigError,
    check_config,
    config_problems,
    deep_update,
    is_pinned_revision,
    resolve_config,
)

SCHEMA = PROJECT / "workflow" / "schemas" / "config.schema.yaml"


@pytest.mark.parametrize(
    "overlay, expected",
    [
        ({"trainning": {"steps": 10}}, ["'trainning' was unexpected"]),
        ({"training": {"stepz": 10}}, ["'stepz' was unexpected", "training"]),
        ({"training": {"steps": "ten"}}, ["'ten' is not of type 'integer'", "steps"]),
        ({"ranks": 0}, ["0 is less than the minimum of 1", "ranks"]),
        ({"training": {"steps": 0}}, ["0 is less than the minimum of 1", "steps"]),
        ({"backend": "tpu"}, ["'tpu' is not one of ['cpu', 'neuron']"]),
        ({"weights": {"repo_id": "no-slash"}}, ["'no-slash' does not match", "repo_id"]),
    ],
)
def test_schema_errors_name_the_key_and_the_value(overlay, expected):
    """The schema's checks, as workflow/rules/common.smk runs them (snakemake.utils.validate), in this process."""
    config = deep_update(yaml.safe_load((PROJECT / "config" / "config.yaml").read_text()), overlay)
    with pytest.raises(WorkflowError) as error:
        validate(config, str(SCHEMA))
    for fragment in expected:
        assert fragment in str(error.value), str(error.value)


def test_a_schema_error_stops_the_run_at_parse_time_before_any_job(workspace):
    ws = workspace({"trainning": {"steps": 10}})
    result = run_snakemake(ws, "-n")
    assert result.returncode != 0
    assert "'trainning' was unexpected" in output(result), output(result)
    assert planned_jobs(result) == {}


def test_an_old_key_name_is_refused_with_its_new_name():
    """Per-stage keys are named by their stage (config.RENAMED_KEYS); a config written before says which name
    replaced each key it uses, where the schema alone would say only that the key was unexpected."""
    from qwen3_pilot.parse_time.config import ConfigError, check_renamed_keys

    old = {"training": {"accepted_differences": {"hf": {"max_position_embeddings": "why"}},
                        "gate": {"control_above_ln_vocab": {"native": 1.0}}},
           "kernel_numerics": {"train": {"loss_tolerance": 1e-5}}}
    with pytest.raises(ConfigError) as refused:
        check_renamed_keys(old)
    assert str(refused.value).splitlines()[1:] == [
        "  - training.accepted_differences.hf: renamed to training.accepted_differences.train_hf; rename it in your "
        "config file",
        "  - training.gate.control_above_ln_vocab.native: renamed to "
        "training.gate.control_above_ln_vocab.train_native; rename it in your config file",
        "  - kernel_numerics.train.loss_tolerance: renamed to kernel_numerics.train.tiny_model_loss_tolerance; rename "
        "it in your config file"]
    check_renamed_keys(default_config())  # the shipped configs use the new names


def test_seq_len_the_neuron_rope_kernel_cannot_take_stops_a_trn2_run_and_not_a_cpu_one(workspace):
    """The NKI kernel's rule is the neuron backend's (backends/neuron/config_rules.py): a trn2 config breaking it
    stops at parse time; the cpu backend's kernels take the same length."""
    ws = workspace()
    (ws / "config" / "seq_len_384.yaml").write_text("training:\n  seq_len: 384\n")
    result = run_snakemake(ws, "-n", "--configfile", "config/trn2.yaml", "config/seq_len_384.yaml")
    assert result.returncode != 0
    assert "training.seq_len = 384: must be a multiple of 128 x neuron.lnc = 256" in output(result)
    assert config_problems(default_config({"training": {"seq_len": 384}, "fail_fast": {"seq_len": 384}})) == []


def test_defaults_fill_in_and_the_default_config_passes():
    config = default_config()
    assert config["neuron"]["lnc"] == 2 and config["fixture"]["head_dim"] == 64
    assert config_problems(config) == []


def test_a_convergence_run_evaluated_only_once_is_refused_before_any_job():
    config = default_config({"convergence": {"steps": 20, "eval_every": 25}})
    assert config_problems(config) == [
        "convergence.eval_every = 25 is more than convergence.steps = 20: the held-out loss would be measured once, "
        "after step 1, with nothing to fall from"]


def test_trn2_config_is_valid_and_has_the_pilot_values():
    config = yaml.safe_load((PROJECT / "config" / "trn2.yaml").read_text())
    validate(config, str(SCHEMA))
    resolve_config(config)
    assert (config["backend"], config["ranks"], config["nodes"], config["neuron"]["lnc"]) == ("neuron", 64, 1, 2)
    assert config["weights"]["repo_id"] == "Qwen/Qwen3-4B-Instruct-2507"
    # global_batch_size: null is one sequence per rank, over every node.
    assert (config["training"]["local_batch_size"], config["training"]["global_batch_size"]) == (1, 64)
    assert default_config(yaml.safe_load((PROJECT / "config" / "trn2.yaml").read_text()),
                          {"nodes": 2})["training"]["global_batch_size"] == 128
    assert config["training"]["steps"] == 10 and config["data"]["dataset"] == "c4_test"
    # The seed's third configuration: the reduced MoE with both kernels; the native 4B recipe with the NKI RoPE
    # (the seed's replacement check on the 4B model); SDPA attention everywhere.
    assert config["kernels"]["moe_reduced"] == ["rope_hf", "moe_grouped_experts"]
    assert config["kernels"]["train_native"] == ["rope_hf"] and config["training"]["attention"] == "sdpa"
    assert config["plan"]["hbm_per_rank_gib"] == 24  # 96 GiB per chip, 4 ranks at LNC=2


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c: c.update(backend="neuron", ranks=32, weights={**c["weights"], "source": "hub"}),
         "ranks = 32: on the neuron backend it must equal chips x cores_per_chip / lnc = 16 x 8 / 2 = 64"),
        (lambda c: c["training"].update(global_batch_size=3),
         "training.global_batch_size = 3: must be a multiple of training.local_batch_size x ranks x nodes"
         " = 1 x 2 x 1 = 2"),
        (lambda c: c["fixture"].update(num_key_value_heads=3),
         "fixture.num_key_value_heads = 3: must divide fixture.num_attention_heads = 4"),
        (lambda c: c.update(backend="neuron", ranks=128) or c["neuron"].update(lnc=1)
         or c["training"].update(seq_len=200),
         "training.seq_len = 200: must be a multiple of 128 x neuron.lnc = 128"),
        (lambda c: c.update(backend="neuron", ranks=64),
         "weights.source = 'fixture': the neuron backend trains the published weights"),
        (lambda c: c.update(backend="neuron", ranks=64) or c["training"].update(attention="flex"),
         "training.attention = 'flex': flex attention compiles with inductor and Triton, which the neuron backend "
         "does not have; allowed on neuron: 'sdpa'"),
        (lambda c: c.update(backend="neuron", ranks=64) or c["benchmark"].update(compile_backend="aot_eager"),
         "benchmark.compile_backend = 'aot_eager': the neuron backend compiles with its own (torch-neuronx's); "
         "allowed on neuron: 'default'"),
        (lambda c: c.update(backend="neuron", ranks=64) or c["fail_fast"].update(compile_backend="aot_eager"),
         "fail_fast.compile_backend = 'aot_eager': the neuron backend compiles with its own (torch-neuronx's); "
         "allowed on neuron: 'default'"),
        (lambda c: c.update(backend="neuron", ranks=64) or c["fail_fast"].update(seq_len=200),
         "fail_fast.seq_len = 200: must be a multiple of 128 x neuron.lnc = 256"),
        (lambda c: c["benchmark"]["price"].update(per_hour=40.0, kind="on-demand"),
         "benchmark.price.per_hour = 40.0: also set benchmark.price.region, benchmark.price.as_of, "
         "benchmark.price.source (which price it is, where, when, and from where)"),
        (lambda c: c["benchmark"].update(compile_recipes=["moe_reduced"], recipes=["train_native"]),
         "benchmark.compile_recipes = ['moe_reduced']: moe_reduced not in benchmark.recipes = ['train_native']"),
    ],
)
def test_cross_key_rules_name_key_value_and_what_is_allowed(change, message):
    config = copy.deepcopy(default_config())
    change(config)
    with pytest.raises(ConfigError) as raised:
        check_config(config)
    assert message in str(raised.value)


def test_only_a_commit_hash_counts_as_pinned():
    assert is_pinned_revision("0123456789abcdef0123456789abcdef01234567")
    assert not is_pinned_revision("main")
    assert not is_pinned_revision("v1.0")


def test_each_training_rule_gets_only_the_training_settings_its_runs_read():
    """Measuring params (stage_training) hold no threshold and no reason, only what the trainer reads; the judge's
    (stage_judging) hold only that stage's thresholds."""
    from qwen3_pilot.parse_time.config import TRAINER_KEYS, stage_judging, stage_training

    config = default_config({"training": {"accepted_differences": {"train_native": {"rope_theta": "why"}}}})
    hf = stage_training(config, "train_hf")
    assert set(hf) == {*TRAINER_KEYS, "accepted_differences"}  # no native_flavor, no gate
    assert hf["accepted_differences"] == {"train_hf": ["max_position_embeddings"]}  # the field, not its reason
    native = stage_training(config, "train_native")
    assert native["native_flavor"] is None and native["accepted_differences"] == {"train_native": ["rope_theta"]}
    assert set(stage_training(config, "moe_reduced")) == {*TRAINER_KEYS, "accepted_differences"}
    bench = stage_training(config, "train_native", "moe_reduced")
    assert set(bench["accepted_differences"]) == {"train_native"}
    judged = stage_judging(config, "train_native")
    assert judged["gate"]["control_above_ln_vocab"] == 1.5 and judged["accepted_differences"] == {"rope_theta": "why"}
    assert "loss_tolerance" not in judged  # no kernels.train_native: no replaced run to hold to it
    assert stage_judging(config, "train_hf")["gate"]["control_above_ln_vocab"] == 4.5
    assert stage_judging(config, "moe_reduced") == {"loss_tolerance": config["kernels"]["loss_tolerance"]}


def test_only_the_repeated_recipe_launches_its_control_twice_and_is_judged_on_it():
    """training.repeat: its steps are the repeated recipe's params (stage_repeat_steps), its tolerance that recipe's
    judge's; the other recipe and its judge get neither, so an edit to it reruns only the repeated recipe."""
    from qwen3_pilot.parse_time.config import stage_judging, stage_repeat_steps, stage_training

    config = default_config({"training": {"repeat": {"loss_tolerance": 0.5}}})
    assert stage_repeat_steps(config, "train_native") == 3 and stage_repeat_steps(config, "train_hf") == 0
    assert stage_judging(config, "train_native")["repeat_loss_tolerance"] == 0.5
    assert "repeat_loss_tolerance" not in stage_judging(config, "train_hf")
    assert "repeat" not in stage_training(config, "train_native")  # the benchmark shares these params


def test_export_reload_and_kernel_numerics_measure_without_the_keys_their_judge_reads():
    """A tolerance edit re-judges without measuring again: the measuring rule's params (stage_measuring) leave out
    exactly the keys the judge's (stage_judging) hold."""
    from qwen3_pilot.parse_time.config import stage_judging, stage_measuring

    config = default_config()
    export = stage_measuring(config, "export_reload")
    assert "logits_tolerance" not in export and "min_argmax_agreement" not in export and export["seq_len"] == 64
    assert stage_judging(config, "export_reload") == {"logits_tolerance": 1e-4, "min_argmax_agreement": 0.99}
    numerics = stage_measuring(config, "kernel_numerics")
    assert "tolerance" not in json.dumps(numerics) and numerics["train"]["steps"] == 4
    assert stage_judging(config, "kernel_numerics")["rope"] == {"tolerances": {"float32": 1e-6, "bfloat16": 3.2e-2}}
    assert "tolerances" in config["kernel_numerics"]["rope"]  # the config itself is left whole


def test_params_taken_from_a_section_do_not_move_when_an_overlay_reorders_it():
    """Snakemake compares params as written, key order included, and a --configfile overlay moves the keys it sets
    to the front of their section: kernel_numerics would measure again after a tolerance edit."""
    from qwen3_pilot.parse_time.config import stage_measuring

    config = default_config()
    numerics = config["kernel_numerics"]
    reordered = {**config, "kernel_numerics": {"train": numerics["train"], **numerics}}
    assert list(reordered["kernel_numerics"]) != list(config["kernel_numerics"])
    assert (json.dumps(stage_measuring(reordered, "kernel_numerics"))
            == json.dumps(stage_measuring(config, "kernel_numerics")))
