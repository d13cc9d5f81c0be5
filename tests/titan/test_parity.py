"""Config parity between a recipe's built model and the checkpoint's config.json."""

from __future__ import annotations

import json

import pytest

from qwen3_pilot.titan.parity import ParityError, check_parity, checkpoint_values, parity_table, read_checkpoint_values

# Qwen3-4B-Instruct-2507's config.json, the fields that matter here (transformers v5 layout).
QWEN3_4B_2507 = {
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 2560,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 9728,
    "rope_parameters": {"rope_type": "default", "rope_theta": 5000000},
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "max_position_embeddings": 262144,
    "hidden_act": "silu",
    "attention_bias": False,
}


def test_torchtitan_4b_flavor_against_qwen3_4b_2507_names_rope_theta():
    from torchtitan.models.qwen3 import model_registry

    from qwen3_pilot.titan.models import native_model_values, use_sdpa

    model = model_registry("4B").model
    use_sdpa(model)
    rows, problems = parity_table(native_model_values(model), checkpoint_values(QWEN3_4B_2507), {})
    assert "rope_theta: built 1000000.0, checkpoint config.json 5000000.0" in problems
    by_field = {row["field"]: row for row in rows}
    for field in ("vocab_size", "hidden_size", "num_hidden_layers", "head_dim", "intermediate_size",
                  "tie_word_embeddings"):
        assert by_field[field]["verdict"] == "match", by_field[field]
    assert by_field["rope_theta"]["verdict"] == "MISMATCH"


def test_native_model_from_checkpoint_takes_every_field_from_config_json():
    from qwen3_pilot.titan.models import native_model_from_checkpoint, native_model_values, use_sdpa

    expected = checkpoint_values(QWEN3_4B_2507)
    model = native_model_from_checkpoint(expected)
    use_sdpa(model)
    rows, problems = parity_table(native_model_values(model), expected, {})
    assert problems == [] and {row["verdict"] for row in rows} == {"match"}


def test_an_accepted_difference_passes_with_its_reason_and_is_still_shown(tmp_path):
    checkpoint = checkpoint_values(QWEN3_4B_2507)
    built = {**checkpoint, "max_position_embeddings": 2048}
    out = tmp_path / "parity.json"
    rows = check_parity("train_hf", built, checkpoint, {"max_position_embeddings": "seq_len only"}, out)
    row = next(r for r in rows if r["field"] == "max_position_embeddings")
    assert row == {"field": "max_position_embeddings", "built": 2048, "checkpoint": 262144,
                   "verdict": "accepted difference: seq_len only"}
    assert json.loads(out.read_text())["problems"] == []


@pytest.mark.parametrize("rank_zero", [True, False], ids=["rank_0", "another_rank"])
def test_a_difference_not_accepted_fails_and_is_written_first_by_any_rank(tmp_path, rank_zero):
    """Whichever rank fails first ends the launch: each writes the failing table before it raises."""
    checkpoint = checkpoint_values(QWEN3_4B_2507)
    out = tmp_path / "parity.json"
    with pytest.raises(ParityError, match=r"head_dim: built 64, checkpoint config.json 128"):
        check_parity("train_native", {**checkpoint, "head_dim": 64}, checkpoint, {}, out, writes_a_pass=rank_zero)
    assert json.loads(out.read_text())["problems"] == ["head_dim: built 64, checkpoint config.json 128"]


def test_only_rank_0_writes_a_passing_table(tmp_path):
    checkpoint = checkpoint_values(QWEN3_4B_2507)
    check_parity("train_native", checkpoint, checkpoint, {}, tmp_path / "other.json", writes_a_pass=False)
    check_parity("train_native", checkpoint, checkpoint, {}, tmp_path / "rank0.json")
    assert not (tmp_path / "other.json").exists()
    assert json.loads((tmp_path / "rank0.json").read_text())["problems"] == []


def test_an_unknown_accepted_field_is_refused():
    checkpoint = checkpoint_values(QWEN3_4B_2507)
    with pytest.raises(ParityError, match="unknown fields \\['rope_scaling'\\]"):
        parity_table(checkpoint, checkpoint, {"rope_scaling": "why"})


@pytest.mark.parametrize(
    "change, message",
    [
        ({"rope_theta": 1000000}, "rope theta mismatch: rope_parameters.rope_theta = 5000000 but rope_theta = 1000000"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 5e6}}, "rope_type = 'yarn'"),
        ({"rope_parameters": {}}, "no rope_theta"),
        ({"model_type": "llama"}, "model_type = 'llama'"),
        ({"attention_bias": True}, "attention_bias = True"),
    ],
)
def test_config_json_that_no_recipe_can_match_is_refused_with_the_key(tmp_path, change, message):
    (tmp_path / "config.json").write_text(json.dumps({**QWEN3_4B_2507, **change}))
    with pytest.raises(ParityError, match=str(tmp_path / "config.json")) as error:
        read_checkpoint_values(tmp_path)
    assert message in str(error.value)


def test_a_v4_config_with_top_level_rope_theta_reads():
    config = {k: v for k, v in QWEN3_4B_2507.items() if k != "rope_parameters"}
    assert checkpoint_values({**config, "rope_theta": 5000000})["rope_theta"] == 5e6


def test_missing_keys_are_named(tmp_path):
    config = {k: v for k, v in QWEN3_4B_2507.items() if k not in ("head_dim", "vocab_size")}
    with pytest.raises(ParityError, match="missing keys vocab_size, head_dim"):
        checkpoint_values(config)
