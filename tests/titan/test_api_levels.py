"""The adapter per torchtitan API level: the installed torchtitan's level, and the same run spelt on each level
(the batch in rows or in tokens, RoPE's table length under either name). Whether a real torchtitan of each level
trains the recipes is docs/torchtitan-compat.md's table (`make titan-compat`)."""

from __future__ import annotations

import dataclasses

import pytest

from qwen3_pilot.titan import api_levels
from qwen3_pilot.titan.api_levels import GRAIN, GRAIN_FOLDED, HF_DATASETS
from qwen3_pilot.titan.api_names import TORCHTITAN_API
from qwen3_pilot.titan.titan_api import missing_api
from qwen3_pilot.trainer_run import TrainerRun


def a_run(**changes) -> TrainerRun:
    values = dict(stage="train_native", backend="cpu", checkpoint="ckpt", dataset="c4_test", dataset_path="corpus",
                  steps=3, seq_len=256, local_batch_size=2, global_batch_size=8, seed=1, lr=1e-3, warmup_steps=1,
                  mixed_precision_param="float32", export_dtype="float32", attention="sdpa", comm_init_timeout_s=60,
                  comm_train_timeout_s=60, peak_flops_per_rank=1.0, parity_path="parity.json")
    return TrainerRun(**{**values, **changes})


@dataclasses.dataclass(kw_only=True)
class FoldedTrainingConfig:
    """TrainingConfig's fields on the folded level, and no CUDA-graph switch (as upstream before 2026-08-13)."""

    num_tokens_per_microbatch_per_dp_rank: int = 16384
    num_tokens_per_train_step: int = -1
    max_context_length: int = 2048
    steps: int = 10000
    mixed_precision_param: str = "bfloat16"


def test_the_installed_torchtitan_is_on_the_hf_datasets_level_and_checked_for_that_levels_names_only():
    assert api_levels.installed_level() == HF_DATASETS
    assert missing_api() == []
    folded_only = tuple(entry for entry in TORCHTITAN_API if entry.levels == (GRAIN_FOLDED,))
    assert folded_only and missing_api(folded_only) == []  # 0.3.0 has none of them, and is not asked for them


def test_the_batch_in_rows_with_cuda_graphs_off_where_the_torchtitan_has_the_switch():
    config = api_levels.training_config(a_run(), level=HF_DATASETS)
    assert (config.local_batch_size, config.global_batch_size, config.seq_len) == (2, 8, 256)
    assert (config.steps, config.mixed_precision_param, config.disable_cuda_graphs) == (3, "float32", True)


def test_the_folded_level_counts_the_same_batch_in_tokens(monkeypatch):
    import torchtitan.config

    monkeypatch.setattr(torchtitan.config, "TrainingConfig", FoldedTrainingConfig)
    config = api_levels.training_config(a_run(), level=GRAIN_FOLDED)
    assert config == FoldedTrainingConfig(num_tokens_per_microbatch_per_dp_rank=2 * 256,
                                          num_tokens_per_train_step=8 * 256, max_context_length=256, steps=3,
                                          mixed_precision_param="float32")
    # No global batch given: torchtitan's own "one gradient-accumulation step" on that level too.
    assert api_levels.training_config(a_run(global_batch_size=-1), level=GRAIN_FOLDED).num_tokens_per_train_step == -1


@pytest.mark.parametrize(("level", "field"), [(HF_DATASETS, "max_seq_len"), (GRAIN, "max_seq_len"),
                                              (GRAIN_FOLDED, "max_context_length")])
def test_the_rope_table_length_goes_into_the_levels_field(level, field):
    @dataclasses.dataclass(kw_only=True)
    class RopeConfig:
        dim: int
        theta: float
        max_seq_len: int = 0
        max_context_length: int = 0

    config = api_levels.rope_config(dim=8, length=512, theta=1e6, config_class=RopeConfig, level=level)
    assert getattr(config, field) == 512 and config.dim == 8 and config.theta == 1e6
    assert {"max_seq_len", "max_context_length"} - {field} == {name for name in ("max_seq_len", "max_context_length")
                                                              if getattr(config, name) == 0}


def test_row_causal_sdpa_attends_causally_within_each_row_and_nowhere_else():
    """The folded level's SDPA gives, per row of the token stream, what SDPA gives that row as a batch entry."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    from qwen3_pilot.titan.attention import RowCausalSDPA

    generator = torch.Generator().manual_seed(0)
    rows, row_length, heads, head_dim = 3, 5, 2, 4
    q, k, v = (torch.randn(rows * row_length, heads, head_dim, generator=generator) for _ in range(3))
    out = RowCausalSDPA(RowCausalSDPA.Config(row_length=row_length))(q, k, v, scale=None, enable_gqa=False)
    assert out.shape == q.shape
    for row in range(rows):
        tokens = slice(row * row_length, (row + 1) * row_length)
        q_NLH, k_NLH, v_NLH = (t[tokens].transpose(0, 1) for t in (q, k, v))
        expected = F.scaled_dot_product_attention(q_NLH, k_NLH, v_NLH, is_causal=True).transpose(0, 1)
        torch.testing.assert_close(out[tokens], expected)
    with pytest.raises(ValueError, match="15 tokens are not whole rows of row_length=4"):
        RowCausalSDPA(RowCausalSDPA.Config(row_length=4))(q, k, v)


def test_the_recipes_sdpa_is_the_row_causal_one_on_the_folded_level_only(monkeypatch):
    from types import SimpleNamespace

    from torchtitan.models.common.attention import ScaledDotProductAttention

    from qwen3_pilot.titan.attention import RowCausalSDPA
    from qwen3_pilot.titan.models import set_attention

    def model():
        return SimpleNamespace(layers=[SimpleNamespace(attention=SimpleNamespace(inner_attention=None))] * 2)

    built = model()
    set_attention(built, "sdpa", 256)
    assert type(built.layers[0].attention.inner_attention) is ScaledDotProductAttention.Config
    monkeypatch.setattr(api_levels, "installed_level", lambda: GRAIN_FOLDED)
    set_attention(built, "sdpa", 256)
    assert built.layers[1].attention.inner_attention == RowCausalSDPA.Config(row_length=256)
    set_attention(kept := model(), "flex", 256)
    assert kept.layers[0].attention.inner_attention is None
