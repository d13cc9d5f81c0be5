"""torchtitan model configs built from a checkpoint's config.json or from the config (torch-free until
called): the native Qwen3 sized from the checkpoint, the reduced MoE, SDPA attention, and the values the
parity check reads back from what was built. Used inside the ranks (qwen3_pilot.titan.in_ranks.recipes) and in
the stage processes that build the same models (export_reload, kernel_numerics, moe_reduced, preflight)."""

from __future__ import annotations

from typing import Any


def qwen3_decoder(*, dim: int, vocab: int, tied: bool, layers: list):
    """torchtitan's Qwen3Model.Config around a list of block configs, initialised as torchtitan's flavors are."""
    from torchtitan.models.common import Embedding, Linear
    from torchtitan.models.qwen3 import _EMBEDDING_INIT, _EMBEDDING_SKIP_INIT, _LINEAR_INIT, _qwen3_norm
    from torchtitan.models.qwen3.model import Qwen3Model

    return Qwen3Model.Config(
        vocab_size=vocab,
        dim=dim,
        norm=_qwen3_norm(dim),
        enable_weight_tying=tied,
        tok_embeddings=Embedding.Config(
            num_embeddings=vocab, embedding_dim=dim, param_init=_EMBEDDING_SKIP_INIT if tied else _EMBEDDING_INIT
        ),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=_LINEAR_INIT),
        layers=layers,
    )


def native_model_from_checkpoint(hf: dict[str, Any]):
    """A torchtitan Qwen3Model.Config with every size taken from the checkpoint's config values
    (`parity.checkpoint_values`), built with torchtitan's own Qwen3 builders."""
    from torchtitan.models.common.nn_modules import RMSNorm
    from torchtitan.models.qwen3 import _build_qwen3_layers

    from .api_levels import rope_config

    dim, head_dim = hf["hidden_size"], hf["head_dim"]
    model = qwen3_decoder(
        dim=dim,
        vocab=hf["vocab_size"],
        tied=hf["tie_word_embeddings"],
        layers=_build_qwen3_layers(
            fuse_qkv=True,
            n_layers=hf["num_hidden_layers"],
            dim=dim,
            n_heads=hf["num_attention_heads"],
            n_kv_heads=hf["num_key_value_heads"],
            head_dim=head_dim,
            hidden_dim=hf["intermediate_size"],
            attn_backend="flex",  # replaced by use_sdpa(); get_attention_config("sdpa") raises in 0.3.0
            rope=rope_config(dim=head_dim, length=hf["max_position_embeddings"], theta=hf["rope_theta"]),
        ),
    )
    # _qwen3_norm hard-codes eps=1e-6; the checkpoint's value wins.
    for _, norm, _, _ in model.traverse(RMSNorm.Config):
        norm.eps = hf["rms_norm_eps"]
    return model


def use_sdpa(model, row_length: int | None = None) -> None:
    """SDPA (causal) in every layer: flex attention has no backward on CPU and compiles with inductor and
    Triton, which Trainium has neither of; the seed recipe makes the same choice there. Where torchtitan folds
    the batch into the tokens, causal within each row of `row_length` tokens (the recipe's seq_len)."""
    from .api_levels import GRAIN_FOLDED, installed_level

    if installed_level() == GRAIN_FOLDED:
        from .attention import RowCausalSDPA

        inner = RowCausalSDPA.Config(row_length=row_length)
    else:
        from torchtitan.models.common.attention import ScaledDotProductAttention

        inner = ScaledDotProductAttention.Config()
    for layer in model.layers:
        layer.attention.inner_attention = inner


def set_attention(model, attention: str, row_length: int | None = None) -> None:
    """config training.attention: "sdpa" (every backend's default) or torchtitan's own "flex"."""
    if attention == "sdpa":
        use_sdpa(model, row_length)


def native_model_values(model) -> dict[str, Any]:
    """The parity fields read back from a built torchtitan Qwen3 config (not from what was asked for)."""
    from torchtitan.models.common.nn_modules import RMSNorm

    from .api_levels import rope_length

    def per_layer(get):
        values = {get(layer) for layer in model.layers}
        return values.pop() if len(values) == 1 else sorted(values)

    eps = {norm.eps for _, norm, _, _ in model.traverse(RMSNorm.Config)}
    return {
        "vocab_size": model.vocab_size,
        "hidden_size": model.dim,
        "num_hidden_layers": len(model.layers),
        "num_attention_heads": per_layer(lambda layer: layer.attention.n_heads),
        "num_key_value_heads": per_layer(lambda layer: layer.attention.n_kv_heads),
        "head_dim": per_layer(lambda layer: layer.attention.head_dim),
        "intermediate_size": per_layer(lambda layer: layer.feed_forward.w1.out_features),
        "rope_theta": per_layer(lambda layer: float(layer.attention.rope.theta)),
        "rms_norm_eps": eps.pop() if len(eps) == 1 else sorted(eps),
        "tie_word_embeddings": bool(model.enable_weight_tying),
        "max_position_embeddings": per_layer(lambda layer: rope_length(layer.attention.rope)),
    }


def hf_model_values(hf_config) -> dict[str, Any]:
    """The parity fields of the transformers config the HF backend actually built its model from."""
    parameters = getattr(hf_config, "rope_parameters", None) or {}
    return {
        "vocab_size": hf_config.vocab_size,
        "hidden_size": hf_config.hidden_size,
        "num_hidden_layers": hf_config.num_hidden_layers,
        "num_attention_heads": hf_config.num_attention_heads,
        "num_key_value_heads": hf_config.num_key_value_heads,
        "head_dim": hf_config.head_dim,
        "intermediate_size": hf_config.intermediate_size,
        "rope_theta": float(parameters.get("rope_theta", getattr(hf_config, "rope_theta", float("nan")))),
        "rms_norm_eps": hf_config.rms_norm_eps,
        "tie_word_embeddings": bool(hf_config.tie_word_embeddings),
        "max_position_embeddings": hf_config.max_position_embeddings,
    }


def reduced_moe_model(moe: dict[str, Any]):
    """Qwen3-30B-A3B's block (GQA with q/k norm, softmax top-k router with route norm, no shared experts,
    untied head) built with torchtitan's MoE builder at the widths and counts the config gives."""
    from torchtitan.models.qwen3 import _build_qwen3_moe_layers

    from .api_levels import rope_config

    dim, head_dim = moe["dim"], moe["head_dim"]
    return qwen3_decoder(
        dim=dim,
        vocab=moe["vocab_size"],
        tied=False,
        layers=_build_qwen3_moe_layers(
            fuse_qkv=True,
            n_layers=moe["layers"],
            dim=dim,
            n_heads=moe["n_heads"],
            n_kv_heads=moe["n_kv_heads"],
            head_dim=head_dim,
            moe_hidden_dim=moe["moe_hidden_dim"],
            num_experts=moe["experts"],
            top_k=moe["top_k"],
            attn_backend="flex",  # replaced by use_sdpa(), as in the native recipe
            moe_comm_backend="standard",  # no expert parallelism
            rope=rope_config(dim=head_dim, length=moe["max_seq_len"], theta=moe["rope_theta"]),
        ),
    )


def count_parameters(model_config) -> int:
    import torch

    with torch.device("meta"):
        return sum(p.numel() for p in model_config.build().parameters())
