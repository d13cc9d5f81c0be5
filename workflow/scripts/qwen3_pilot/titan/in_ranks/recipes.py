"""The two 4B recipes as torchtitan config functions, for torchtitan's `--module/--config` API:

    torchrun ... -m qwen3_pilot.titan.in_ranks.train_entry --module qwen3_pilot.titan.in_ranks.recipes \
        --config qwen3_native --dump_folder RUN [torchtitan overrides]

Each reads every setting (checkpoint, corpus, steps, batch, MFU peak, random init, compile ...) from the
TrainerRun (trainer_run.py) in the file named by QWEN3_PILOT_RECIPE, which the training stage writes; launching
by hand needs only that file. They run inside every trainer process, so they import torch and torchtitan freely.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

from ...trainer_run import RECIPE_ENV, TrainerRun
from ..models import (
    hf_model_values,
    native_model_from_checkpoint,
    native_model_values,
    reduced_moe_model,
    set_attention,
)
from ..parity import check_parity, read_checkpoint_values


def load_recipe() -> TrainerRun:
    path = os.environ.get(RECIPE_ENV)
    if not path:
        raise RuntimeError(f"{RECIPE_ENV} is not set: it names the recipe JSON the training stage writes")
    return TrainerRun.read(Path(path))


def _is_rank_zero() -> bool:
    return os.environ.get("RANK", "0") == "0"


def _check_parity(name: str, recipe: TrainerRun, built: dict, checkpoint: dict) -> None:
    """check_parity for this rank: rank 0 writes the table, the others only one that fails."""
    check_parity(name, built, checkpoint, dict.fromkeys(recipe.accepted_differences), Path(recipe.parity_path),
                 writes_a_pass=_is_rank_zero())


# ---- native: torchtitan's own Qwen3 model, sized from config.json ----


def use_sdpa_in_hf_backend() -> None:
    """The transformers backend's SDPA: torchtitan's transformers backend registers a flex-attention function
    under "flex_torchtitan" in transformers' AttentionInterface and builds a flex BlockMask per batch (on
    CPU: "NotImplementedError: FlexAttention does not support backward on CPU"; on neuron flex needs
    inductor and Triton). This calls transformers' SDPA path, causal and without a document mask: the
    native recipe's SDPA semantics."""
    import torchtitan.experiments.transformers_modeling_backend.model as hf_backend
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import AttentionInterface

    def sdpa_attention(module, query, key, value, attention_mask, **kwargs):
        kwargs.pop("is_causal", None)
        return sdpa_attention_forward(module, query, key, value, None, is_causal=True, **kwargs)

    hf_backend._flex_attention_torchtitan = sdpa_attention
    AttentionInterface._global_mapping[hf_backend._ATTN_IMPLEMENTATION] = sdpa_attention
    hf_backend.HFTransformerModel.get_attention_masks = lambda self, positions: None


def native_model_spec(recipe: TrainerRun, base_spec):
    """The base recipe's ModelSpec (`base_spec`: its parallelize fn, post-optimizer hook and HF state-dict
    adapter, the fork's own on neuron where its recipe is the base) around the checkpoint's model, or
    torchtitan's registered flavor when the config names one; checked field by field against config.json."""
    from torchtitan.models.qwen3 import model_registry

    from ..replacement import apply_converters

    hf = read_checkpoint_values(Path(recipe.checkpoint))
    flavor = recipe.native_flavor
    converters = recipe_converters(recipe)
    if flavor:
        base = model_registry(flavor, converters=converters)
        model = base.model
    else:
        base = base_spec
        model = apply_converters(native_model_from_checkpoint(hf), converters)
    set_attention(model, recipe.attention, recipe.seq_len)
    _check_parity("train_native", recipe, native_model_values(model), hf)
    return dataclasses.replace(base, flavor=flavor or f"checkpoint:{Path(recipe.checkpoint).name}", model=model)


def recipe_converters(recipe: TrainerRun) -> list:
    """The kernel replacements the recipe names (config key kernels.<stage>), as torchtitan converters."""
    from ..replacement import kernel_converters

    return kernel_converters(recipe.replacements)


# ---- Transformers backend: the HF model class built by Transformers v5 from config.json ----


def check_hf_backend_build(recipe: TrainerRun) -> None:
    """Wraps the HF backend's init_states: after torchtitan built and materialised the model, recompute
    the rotary buffers (see below) and check what was built against config.json, before any training."""
    import torch
    import torchtitan.experiments.transformers_modeling_backend.model as hf_backend
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = read_checkpoint_values(Path(recipe.checkpoint))
    init_states = hf_backend.HFTransformerModel.init_states

    def checked_init_states(self, *, buffer_device=None):
        init_states(self, buffer_device=buffer_device)
        # Not a CPU issue: torchtitan recomputes inv_freq only for rotary modules with a `rope_init_fn`
        # attribute, and transformers 5.16's Qwen3RotaryEmbedding keeps that function local, so after
        # the meta-device build inv_freq is uninitialised memory: step-1 loss NaN on 2 ranks
        # ("Loss is not finite ... at step 1"). Recompute it as the module's __init__ does.
        with torch.no_grad():
            for module in self.model.modules():
                if not hasattr(module, "inv_freq") or getattr(module, "rope_init_fn", None) is not None:
                    continue
                rope_type = getattr(module, "rope_type", "default")
                compute = (
                    module.compute_default_rope_parameters if rope_type == "default" else ROPE_INIT_FUNCTIONS[rope_type]
                )
                inv_freq, scaling = compute(module.config, module.inv_freq.device)
                module.inv_freq.copy_(inv_freq.to(module.inv_freq.dtype))
                if hasattr(module, "original_inv_freq"):
                    module.original_inv_freq.copy_(inv_freq.to(module.original_inv_freq.dtype))
                module.attention_scaling = scaling
        _check_parity("train_hf", recipe, hf_model_values(self.model.config), hf)

    hf_backend.HFTransformerModel.init_states = checked_init_states


# ---- what both recipes share ----


def _shared(config, recipe: TrainerRun):
    from torchtitan.components.optimizer import default_adamw

    from ..api_levels import text_dataloader, training_config
    from ..api_names import CHECKPOINT_MANAGER, LR_SCHEDULERS
    from ..titan_api import import_home
    from .titan_metrics import JsonlMetricsProcessor

    # Each from wherever this torchtitan keeps it (upstream moved both in August 2026).
    CheckpointManager, LRSchedulersContainer = import_home(CHECKPOINT_MANAGER), import_home(LR_SCHEDULERS)  # noqa: N806

    config.hf_assets_path = recipe.checkpoint  # tokenizer.json + tokenizer_config.json
    config.dataloader = text_dataloader(recipe.dataset, recipe.dataset_path)
    config.training = training_config(recipe)
    config.parallelism.data_parallel_shard_degree = -1  # FSDP over every rank
    config.parallelism.tensor_parallel_degree = 1
    config.optimizer = default_adamw(lr=recipe.lr)
    config.lr_scheduler = LRSchedulersContainer.Config(
        warmup_steps=recipe.warmup_steps, decay_ratio=0.8, decay_type="linear", min_lr_factor=0.0
    )
    config.checkpoint = CheckpointManager.Config(
        # Off: random init, nothing saved or exported (the control run, the benchmark, the reduced MoE).
        enable=recipe.use_checkpoint,
        interval=recipe.steps,
        initial_load_path=recipe.checkpoint,
        initial_load_in_hf=True,
        initial_load_model_only=True,
        last_save_in_hf=True,
        last_save_model_only=True,
        export_dtype=recipe.export_dtype,
    )
    config.metrics = JsonlMetricsProcessor.Config(
        log_freq=1, peak_flops=recipe.peak_flops_per_rank, enable_tensorboard=False
    )
    if recipe.compile_backend is not None:  # otherwise the base recipe's own setting
        config.compile.enable = True
        config.compile.backend = recipe.compile_backend
    if recipe.validation_path is not None:
        from torchtitan.components.validate import Validator

        config.validator = Validator.Config(
            enable=True, freq=recipe.validation_every, steps=recipe.validation_batches,
            dataloader=text_dataloader(recipe.dataset, recipe.validation_path, validation=True),
        )
    config.comm.init_timeout_seconds = recipe.comm_init_timeout_s
    config.comm.train_timeout_seconds = recipe.comm_train_timeout_s
    config.debug.seed = recipe.seed
    config.debug.print_config = False
    config.profiler.enable_profiling = False
    return config


def qwen3_native():
    """torchtitan's qwen3_32b recipe (on neuron, the TorchTitan Neuron fork's Qwen3 recipe where it has one:
    titan_api.native_base) with the checkpoint's model in place of its model."""
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.models.common.config_utils import decoder_vocab_size

    from ..titan_api import native_base

    recipe = load_recipe()
    base, base_name = native_base(recipe.backend)
    config = base()
    config.model_spec = native_model_spec(recipe, config.model_spec)
    log_base("native", base_name, config)
    config.loss = ChunkedLossWrapper.Config(
        loss_fn=CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(config.model_spec))
    )
    return _shared(config, recipe)


def taken_from_base(config) -> dict[str, str]:
    """What a recipe's trainer config takes from its base recipe (on neuron the fork's where its recipe is the
    base): the parallelize function and the SPMD backend. The rank-0 log and the preflight show these."""
    parallelize = config.model_spec.parallelize_fn
    # A fork may hand over a callable without a qualified name (a functools.partial): named by its repr then.
    name = getattr(parallelize, "__qualname__", None)
    return {"parallelize_fn": f"{parallelize.__module__}.{name}" if name else repr(parallelize),
            "spmd_backend": getattr(config.parallelism, "spmd_backend", "(none in this torchtitan)")}


def log_base(recipe: str, base_name: str, config) -> None:
    """What the recipe took from its base, in the rank-0 log, with the config function it started from."""
    taken = taken_from_base(config)
    logging.getLogger(__name__).warning("%s recipe base: %s; parallelize_fn %s; spmd_backend %s", recipe, base_name,
                                        taken["parallelize_fn"], taken["spmd_backend"])


def qwen3_hf():
    """torchtitan's transformers-backend fine-tuning recipe ('full' flavor: config.json's sizes win)."""
    import torchtitan.experiments.transformers_modeling_backend.model as hf_backend
    from torchtitan.experiments.transformers_modeling_backend.config_registry import (
        transformers_modeling_backend_full,
    )

    recipe = load_recipe()
    # torchtitan 0.3.0's transformers backend loads the config with trust_remote_code=True for every
    # model_type outside its denylist; Qwen3 is built into transformers, so no remote code is ever wanted.
    hf_backend._REMOTE_CONFIG_DENYLIST = hf_backend._REMOTE_CONFIG_DENYLIST | {"qwen3"}
    check_hf_backend_build(recipe)
    if recipe.attention == "sdpa":
        use_sdpa_in_hf_backend()
    config = transformers_modeling_backend_full()
    config.hf_model = recipe.checkpoint  # AutoConfig from the local folder; no remote code
    return _shared(config, recipe)


# ---- the reduced MoE: Qwen3-30B-A3B's architecture with fewer layers and experts, from random init ----


def qwen3_moe_reduced():
    """torchtitan's qwen3_32b recipe with the reduced MoE in place of the 32B model, trained from random
    init (there are no reduced weights to load) with the router's load recorded per step."""
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.models.common.config_utils import decoder_vocab_size
    from torchtitan.models.qwen3 import model_registry

    from ..replacement import apply_converters
    from ..titan_api import native_base
    from .titan_metrics import recording_router_load

    recipe = load_recipe()
    base = model_registry("30B-A3B")
    model = apply_converters(reduced_moe_model(recipe.moe), recipe_converters(recipe))
    set_attention(model, recipe.attention, recipe.seq_len)
    # The trainer's settings from the native recipe's base (on neuron the fork's Qwen3 recipe where it has one,
    # with its SPMD backend); the model spec is upstream's 30B-A3B one, whose parallelize fn shards experts.
    base_function, base_name = native_base(recipe.backend)
    config = base_function()
    config.model_spec = dataclasses.replace(
        base, flavor="30B-A3B-reduced", model=model,
        post_optimizer_build_fn=recording_router_load(base.post_optimizer_build_fn, recipe.router_load_path),
    )
    config.loss = ChunkedLossWrapper.Config(
        loss_fn=CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(config.model_spec))
    )
    log_base("moe_reduced", base_name, config)
    if recipe.use_checkpoint:
        raise ValueError(f"{RECIPE_ENV}: the reduced MoE trains from random init; use_checkpoint must be false")
    config.compile.enable = False  # eager, as the pilot specifies, unless the run asks for torch.compile
    return _shared(config, recipe)
