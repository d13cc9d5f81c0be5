"""Every torchtitan class, config field and function this project uses: for each, which recipes (by config
function) and stage modules need it, on which backends and API levels (api_levels.py), and what must hold (its
dataclass fields, parameters, attributes). titan_api.py checks them against the installed torchtitan.

Add an `ApiEntry` to `TORCHTITAN_API` for anything new the project starts to use (a kernel converter, another
config field), and its row, with when upstream main got it, to docs/torchtitan-compat.md's table (a test holds the
two together). A name upstream moved between modules gets its other `homes`; the code imports it with
titan_api.import_home. Importing this module imports neither torch nor torchtitan.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import recipe_registry as recipes
from .api_levels import GRAIN_FOLDED, HF_DATASETS, LEVELS, UNFOLDED, WITH_GRAIN

ALL_BACKENDS = ("cpu", "neuron")
# The recipes, by the config function a trainer is started with (--config; in_ranks/recipes.py).
RECIPES = tuple(recipe.config_function for recipe in recipes.RECIPES)
NATIVE = recipes.recipe_of("train_native").config_function
HF = recipes.recipe_of("train_hf").config_function
MOE = recipes.recipe_of("moe_reduced").config_function
# Stage modules that build torchtitan models outside a trainer.
RANK_PLAN, NUMERICS, EXPORT = "rank_plan.py", "kernel_numerics/tiny_models.py", "export_reload/hf_export.py"
# models.qwen3_decoder builds the native model from config.json: the native recipe, kernel_numerics, hf_export.py.
DECODER_USERS = (NATIVE, NUMERICS, EXPORT)
# The kernel converters: the recipes that list replacements, and kernel_numerics.
CONVERTER_USERS = (NATIVE, MOE, NUMERICS)


@dataclass(frozen=True)
class ApiEntry:
    """One name in a torchtitan module, with what must hold for it.

    `name` is dotted inside the module ("Trainer.Config"); `fields` must be dataclass fields of it,
    `parameters` parameters of its signature, `assigns` attributes its `__init__` sets (instance attributes
    have no class-level trace), `attributes` plain attributes of it. `used_by` says what in this project uses it
    (the error message's reason).
    """

    module: str
    name: str
    used_by: str
    fields: tuple[str, ...] = ()
    parameters: tuple[str, ...] = ()
    assigns: tuple[str, ...] = ()
    attributes: tuple[str, ...] = ()
    backends: tuple[str, ...] = ALL_BACKENDS
    # Who needs it: the recipes by config function (a trainer checks only its own recipe's names before it
    # starts), and the stage modules that build models outside a trainer (checked by the preflight).
    users: tuple[str, ...] = RECIPES
    # Other modules where some torchtitan keeps the same name: the entry holds if `module` or any of these has
    # it, and titan_api.import_home imports it from the first that does.
    homes: tuple[str, ...] = ()
    # The API levels (api_levels.py) whose adapter uses the name: a torchtitan is checked for its own level's.
    levels: tuple[str, ...] = LEVELS

    @property
    def target(self) -> str:
        return f"{self.module}.{self.name}"


TORCHTITAN_API: tuple[ApiEntry, ...] = (
    # ---- the trainer and its config (in_ranks/train_entry.py, in_ranks/recipes.py) ----
    ApiEntry("torchtitan.train", "main", "train_entry.py runs it"),
    ApiEntry("torchtitan.trainer", "Trainer.Config", "the recipes return one", fields=("model_spec",)),
    ApiEntry("torchtitan.trainer", "Trainer.Config", "the recipes set them",
             fields=("hf_assets_path", "dataloader", "training", "parallelism", "optimizer", "lr_scheduler",
                     "checkpoint", "metrics", "debug", "profiler", "loss", "compile")),
    ApiEntry("torchtitan.config", "TrainingConfig", "api_levels.training_config sets them",
             fields=("steps", "mixed_precision_param")),
    ApiEntry("torchtitan.config", "TrainingConfig", "api_levels.training_config sets the batch in rows",
             fields=("local_batch_size", "global_batch_size", "seq_len"), levels=UNFOLDED),
    ApiEntry("torchtitan.config", "TrainingConfig", "api_levels.training_config sets the batch in tokens",
             fields=("num_tokens_per_microbatch_per_dp_rank", "num_tokens_per_train_step", "max_context_length"),
             levels=(GRAIN_FOLDED,)),
    ApiEntry("torchtitan.config", "TrainingConfig", "rank_plan.py reads it", users=(RANK_PLAN,), fields=("dtype",)),
    ApiEntry("torchtitan.config", "ParallelismConfig", "the recipes and rank_plan.py set them",
             users=(*RECIPES, RANK_PLAN),
             fields=("data_parallel_shard_degree", "tensor_parallel_degree", "spmd_backend")),
    ApiEntry("torchtitan.config", "CompileConfig", "the MoE recipe sets it", users=(MOE,), fields=("enable",)),
    ApiEntry("torchtitan.config", "CommConfig", "the recipes set them (training.comm_*_timeout_s)",
             fields=("init_timeout_seconds", "train_timeout_seconds")),
    ApiEntry("torchtitan.trainer", "Trainer.Config", "the recipes set the comm timeouts", fields=("comm",)),
    ApiEntry("torchtitan.config", "DebugConfig", "the recipes set them", fields=("seed", "print_config")),
    ApiEntry("torchtitan.config", "TORCH_DTYPE_MAP", "rank_plan.py reads it", users=(RANK_PLAN,)),
    ApiEntry("torchtitan.tools.profiler", "Profiler.Config", "the recipes set it", fields=("enable_profiling",)),
    (CHECKPOINT_MANAGER := ApiEntry(
        "torchtitan.components.checkpointer", "CheckpointManager.Config", "the recipes set them",
        fields=("enable", "interval", "initial_load_path", "initial_load_in_hf", "initial_load_model_only",
                "last_save_in_hf", "last_save_model_only", "export_dtype"),
        homes=("torchtitan.components.checkpoint",))),
    ApiEntry("torchtitan.components.optimizer", "default_adamw", "the recipes call it", parameters=("lr",)),
    (LR_SCHEDULERS := ApiEntry(
        "torchtitan.components.optimizer", "LRSchedulersContainer.Config", "the recipes set them",
        fields=("warmup_steps", "decay_ratio", "decay_type", "min_lr_factor"),
        homes=("torchtitan.components.lr_scheduler",))),
    ApiEntry("torchtitan.components.loss", "ChunkedLossWrapper.Config", "the recipes set it",
             users=(NATIVE, MOE), fields=("loss_fn",)),
    ApiEntry("torchtitan.components.loss", "CrossEntropyLoss.Config", "the recipes set it", users=(NATIVE, MOE),
             fields=("global_vocab_size",)),
    ApiEntry("torchtitan.hf_datasets.text_datasets", "HuggingFaceTextDataLoader.Config",
             "api_levels.text_dataloader sets them", fields=("dataset", "dataset_path"), levels=(HF_DATASETS,)),
    ApiEntry("torchtitan.components.data", "GrainDataLoader.Config", "api_levels.text_dataloader sets them",
             fields=("dataset", "shuffle", "repeat"), levels=WITH_GRAIN),
    ApiEntry("torchtitan.components.data", "ConcatThenSplitPackingConfig", "api_levels.text_dataloader cuts the "
             "corpus into rows with it", fields=("dataset",), levels=WITH_GRAIN),
    ApiEntry("torchtitan.components.data", "SingleDatasetConfig", "api_levels.text_dataloader sets them",
             fields=("source", "processor", "post_filters"), levels=WITH_GRAIN),
    ApiEntry("torchtitan.components.data", "HuggingFaceRandomAccessSource.Config", "api_levels.text_dataloader "
             "reads the corpus folder with it", fields=("path", "split"), levels=WITH_GRAIN),
    ApiEntry("torchtitan.hf_datasets.text_datasets", "TextProcessor.Config", "api_levels.text_dataloader "
             "tokenizes with it", levels=WITH_GRAIN),
    ApiEntry("torchtitan.components.validate", "Validator.Config", "the native recipe sets them for the convergence "
             "stage's held-out loss", users=(NATIVE,), fields=("enable", "freq", "steps", "dataloader")),
    ApiEntry("torchtitan.trainer", "Trainer.Config", "the native recipe sets it for the convergence stage",
             users=(NATIVE,), fields=("validator",)),
    ApiEntry("torchtitan.components.metrics", "MetricsProcessor.Config", "titan_metrics.py extends it",
             fields=("log_freq", "enable_tensorboard")),
    ApiEntry("torchtitan.components.metrics", "MetricsProcessor", "titan_metrics.py overrides them after "
             "__init__ (the MFU peak, the logger)", assigns=("gpu_peak_flops", "logger")),
    ApiEntry("torchtitan.components.metrics", "BaseLogger", "titan_metrics.py subclasses it"),
    ApiEntry("torchtitan.components.metrics", "LoggerContainer", "titan_metrics.py adds its logger",
             attributes=("add_logger",)),
    # ---- the models (models.py, kernel_numerics, export_reload/hf_export.py, rank_plan.py) ----
    ApiEntry("torchtitan.models.qwen3.config_registry", "qwen3_32b", "the native and MoE recipes build on it",
             users=(NATIVE, MOE)),
    ApiEntry("torchtitan.models.qwen3", "model_registry", "the recipes and rank_plan.py call it",
             users=(NATIVE, MOE, RANK_PLAN),
             parameters=("flavor",)),
    ApiEntry("torchtitan.models.qwen3", "model_registry", "kernel converters are passed to it", users=(NATIVE, MOE),
             parameters=("converters",)),
    ApiEntry("torchtitan.protocols.model", "ModelConfigConverter", "kernel converters subclass it",
             users=CONVERTER_USERS,
             attributes=("Config",)),
    ApiEntry("torchtitan.models.utils", "validate_converter_order", "replacement.apply_converters calls it, "
             "as model_registry does", users=CONVERTER_USERS, parameters=("converters",)),
    ApiEntry("torchtitan.protocols.module", "Module.Config", "the kernel converters walk the model config "
             "with it", users=CONVERTER_USERS, attributes=("traverse", "build")),
    ApiEntry("torchtitan.models.common.rope", "CosSinRoPE", "kernels.rope.HFLayoutRoPE subclasses it and "
             "reads its cache lookup",
             users=CONVERTER_USERS, attributes=("_reshape_cache",)),
    ApiEntry("torchtitan.protocols.model_spec", "ModelSpec", "the recipes replace them", users=(NATIVE, MOE),
             fields=("flavor", "model", "post_optimizer_build_fn", "parallelize_fn")),
    ApiEntry("torchtitan.models.qwen3.model", "Qwen3Model.Config", "models.qwen3_decoder sets them",
             users=DECODER_USERS,
             fields=("vocab_size", "dim", "norm", "enable_weight_tying", "tok_embeddings", "lm_head", "layers"),
             attributes=("traverse", "build", "update_from_config", "get_nparams_and_flops")),
    ApiEntry("torchtitan.models.qwen3", "_build_qwen3_layers", "the native recipe and kernel_numerics call it",
             users=(NATIVE, NUMERICS),
             parameters=("fuse_qkv", "n_layers", "dim", "n_heads", "n_kv_heads", "head_dim", "hidden_dim",
                         "attn_backend", "rope")),
    ApiEntry("torchtitan.models.qwen3", "_build_qwen3_moe_layers", "the MoE recipe and kernel_numerics call it",
             users=(MOE, NUMERICS),
             parameters=("fuse_qkv", "n_layers", "dim", "n_heads", "n_kv_heads", "head_dim", "moe_hidden_dim",
                         "num_experts", "top_k", "attn_backend", "moe_comm_backend", "rope")),
    ApiEntry("torchtitan.models.qwen3", "_qwen3_norm", "models.qwen3_decoder calls it",
             users=DECODER_USERS, parameters=("dim",)),
    *(ApiEntry("torchtitan.models.qwen3", name, "models.qwen3_decoder uses it",
               users=DECODER_USERS)
      for name in ("_EMBEDDING_INIT", "_EMBEDDING_SKIP_INIT", "_LINEAR_INIT")),
    ApiEntry("torchtitan.models.qwen3.state_dict_adapter", "Qwen3StateDictAdapter", "hf_export.py loads "
             "the export with it", users=(EXPORT,), attributes=("from_hf",)),
    ApiEntry("torchtitan.models.common", "Embedding.Config", "models.qwen3_decoder sets them", users=DECODER_USERS,
             fields=("num_embeddings", "embedding_dim", "param_init")),
    ApiEntry("torchtitan.models.common", "Linear.Config", "models.qwen3_decoder sets them", users=DECODER_USERS,
             fields=("in_features", "out_features", "param_init")),
    ApiEntry("torchtitan.models.common", "CosSinRoPE.Config", "api_levels.rope_config sets them",
             users=(NATIVE, MOE, NUMERICS), fields=("dim", "max_seq_len", "theta"), levels=UNFOLDED),
    ApiEntry("torchtitan.models.common", "CosSinRoPE.Config", "api_levels.rope_config sets them",
             users=(NATIVE, MOE, NUMERICS), fields=("dim", "max_context_length", "theta"), levels=(GRAIN_FOLDED,)),
    ApiEntry("torchtitan.models.common.nn_modules", "RMSNorm.Config", "the native recipe sets it", users=DECODER_USERS,
             fields=("eps",)),
    ApiEntry("torchtitan.models.common.attention", "ScaledDotProductAttention.Config", "recipes.use_sdpa "
             "puts it in every layer", users=(NATIVE, MOE)),
    ApiEntry("torchtitan.models.common.attention", "GQAttention.Config", "recipes.use_sdpa and the parity "
             "check read them", users=(NATIVE, MOE),
             fields=("inner_attention", "n_heads", "n_kv_heads", "head_dim", "rope")),
    ApiEntry("torchtitan.models.common.moe", "GroupedExperts.Config", "kernels/moe.py builds it", users=(MOE, NUMERICS),
             fields=("dim", "hidden_dim", "num_experts")),
    ApiEntry("torchtitan.models.common.moe", "MoE.Config", "titan_metrics.recording_router_load reads it", users=(MOE,),
             fields=("load_balance_coeff",)),
    ApiEntry("torchtitan.models.common.moe", "MoE", "titan_metrics.recording_router_load reads and zeroes "
             "the router's counts", users=(MOE,), assigns=("tokens_per_expert_E", "load_balance_coeff")),
    ApiEntry("torchtitan.models.common.config_utils", "decoder_vocab_size", "the recipes call it", users=(NATIVE, MOE)),
    # ---- the transformers modeling backend (recipes.qwen3_hf) ----
    # The dates are the names' own; before af35cfb15 these modules fail to import with transformers 5
    # (HFTransformerModel.Config inherits PretrainedConfig's fields, which are not keyword-only).
    ApiEntry("torchtitan.experiments.transformers_modeling_backend.config_registry",
             "transformers_modeling_backend_full", "the HF recipe builds on it", users=(HF,)),
    ApiEntry("torchtitan.experiments.transformers_modeling_backend.configs", "TransformersBackendConfig",
             "the HF recipe sets it", users=(HF,), fields=("hf_model",)),
    ApiEntry("torchtitan.experiments.transformers_modeling_backend.model", "HFTransformerModel.init_states",
             "the HF recipe wraps it", users=(HF,), parameters=("buffer_device",)),
    ApiEntry("torchtitan.experiments.transformers_modeling_backend.model", "HFTransformerModel",
             "the HF recipe's SDPA setting replaces it", users=(HF,), attributes=("get_attention_masks",)),
    *(ApiEntry("torchtitan.experiments.transformers_modeling_backend.model", name,
               "the HF recipe's SDPA setting and remote-code guard replace it",
               users=(HF,))
      for name in ("_flex_attention_torchtitan", "_ATTN_IMPLEMENTATION", "_REMOTE_CONFIG_DENYLIST")),
    # ---- what the cpu backend and the offline plan patch or call (backends/cpu.py, rank_plan.py) ----
    ApiEntry("torchtitan.tools.utils", "device_type", "the cpu backend's device workaround sets it",
             backends=("cpu",)),
    ApiEntry("torchtitan.tools.utils", "device_module", "the cpu backend's device workaround sets it",
             backends=("cpu",)),
    ApiEntry("torchtitan.tools.utils", "set_default_dtype", "rank_plan.py calls it", users=(RANK_PLAN,)),
    ApiEntry("torchtitan.components.metrics", "build_device_memory_monitor", "the cpu backend's memory "
             "workaround replaces it", backends=("cpu",)),
    ApiEntry("torchtitan.components.metrics", "DeviceMemStats", "the cpu backend's memory workaround "
             "returns it", backends=("cpu",)),
    ApiEntry("torchtitan.distributed.utils", "set_pg_timeouts", "the cpu backend's barrier workaround "
             "replaces it", parameters=("timeout", "parallel_dims"), backends=("cpu",)),
    ApiEntry("torchtitan.distributed.utils", "init_fake_mode", "rank_plan.py calls it", users=(RANK_PLAN,)),
    ApiEntry("torchtitan.distributed", "ParallelDims", "rank_plan.py builds the plan's mesh with it",
             users=(RANK_PLAN,),
             attributes=("from_config", "build_mesh")),
    ApiEntry("torchtitan.distributed.parallel_dims", "device_type", "rank_plan.py patches it", users=(RANK_PLAN,)),
)
