"""Every torchtitan class, config field and function this project uses, checked against the installed
torchtitan before a trainer starts.

A version string says nothing about the API: the aws-neuron torchtitan fork reports "0.2.2+neuron.1"
(workflow/envs/neuron-sdk/), and upstream has reported "0.2.2" from 2026-02-20 (73a0e6979, #2412), three days before
its config refactor, through at least 2026-08-21, while fields the recipes set arrived in between. So the
check looks for each name itself.

Importing this module imports neither torch nor torchtitan; `missing_api` imports the modules it checks.
Add an `ApiEntry` to `TORCHTITAN_API` for anything new the project starts to use (a kernel converter,
another config field); `since` says since when upstream main has the name, for the error message: the first
upstream commit at which the entry holds (its module path exists, the name is in it, and so is every listed
field, parameter and attribute), checked at that commit and at its parent. A name upstream later dropped
says until when. The dates come from upstream's history up to 2026-08-21 (b5bcd76c6); a commit's author
and commit dates agree for every commit named here. A new entry without a `since` gets IN_0_3_0, which the
tests refuse. `users` says which recipes (by config function) and stage modules need the entry: a trainer
checks only its own recipe's entries. A name upstream moved between modules gets its other `homes`, with when
upstream had it there; the code imports it with `import_home`. A torchtitan from before the config refactor is
refused before any entry is looked at (`config_api_problem`). docs/torchtitan-compat.md has which torchtitans
run which recipe (`make titan-compat`).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import recipe_registry as recipes
from ..problems import problem_list
from .api_levels import GRAIN_FOLDED, HF_DATASETS, LEVELS, UNFOLDED, WITH_GRAIN, installed_level

# The default for a new entry, until its upstream date is found (tests/titan/test_titan_api.py refuses it).
IN_0_3_0 = "present in torchtitan 0.3.0 (PyPI); upstream date not established"


def _since(date: str, commit: str, pr: int, note: str = "") -> str:
    """Since when upstream main has a name: the date, short hash and pull request of the first commit at
    which the entry holds (checked there and at its parent)."""
    return f"upstream has it since {date} ({commit}, #{pr}{'; ' + note if note else ''})"


def _had(date: str, commit: str, pr: int, until: str) -> str:
    """For a name upstream main dropped after 0b2a804dd (2026-08-19; of upstream's commits, the one whose
    torchtitan/ the 0.3.0 wheel matches most closely): from when upstream had it, and until which commit."""
    return f"upstream had it from {date} ({commit}, #{pr}) until {until}; torchtitan 0.3.0 (PyPI) has it"


def _private(since: str) -> str:
    return f"{since}; a private name: it may move without notice"


# Commits that brought several of the names.
REPO_LAYOUT = _since("2025-02-21", "82afc842e", 867)  # torchtitan.tools, torchtitan.distributed
METRICS_COMPONENT = _since("2025-03-10", "99f73969e", 945)  # torchtitan.components.metrics
CONFIG_REFACTOR = _since("2026-02-23", "9810191bb", 2386, "the config refactor (--module/--config)")
PARAM_INIT = _since("2026-04-01", "adbaa061c", 2633)  # config-based param_init, init_states
CONFIG_TRAVERSE = _since("2026-04-27", "6348d93d1", 3127)  # Module.Config.traverse
CONVERTERS = _since("2026-05-08", "74181b1e8", 3264)  # ModelConfigConverter, model_registry(converters)
PER_LAYER_ROPE = _since("2026-06-05", "02d24f017", 3458)  # CosSinRoPE, a rope in every layer
CHUNKED_LOSS = _since("2026-06-26", "9530a874d", 3779)
HF_BACKEND_MOE = _since("2026-07-20", "af35cfb15", 2679)  # MoE in the transformers modeling backend
GRAIN_LOADER = _since("2026-08-19", "1b04fc1c3", 4088)  # the grain dataloader (api_levels.GRAIN)
FOLDED_BATCH = _since("2026-08-20", "73aed7f6c", 4121)  # the batch folded into the tokens (api_levels.GRAIN_FOLDED)

ALL_BACKENDS = ("cpu", "neuron")
# The recipes, by the config function a trainer is started with (--config; in_ranks/recipes.py).
RECIPES = tuple(recipe.config_function for recipe in recipes.RECIPES)
NATIVE = recipes.recipe_of("train_native").config_function
HF = recipes.recipe_of("train_hf").config_function
MOE = recipes.recipe_of("moe_reduced").config_function
# Stage modules that build torchtitan models outside a trainer.
RANK_PLAN, NUMERICS, EXPORT = "rank_plan.py", "kernel_numerics/tiny_models.py", "hf_export.py"
# models.qwen3_decoder builds the native model from config.json: the native recipe, kernel_numerics, hf_export.py.
DECODER_USERS = (NATIVE, NUMERICS, EXPORT)
# The kernel converters: the recipes that list replacements, and kernel_numerics.
CONVERTER_USERS = (NATIVE, MOE, NUMERICS)


@dataclass(frozen=True)
class Home:
    """Another module that holds a name in some torchtitan versions, and from when until when."""

    module: str
    when: str


class TorchtitanApiError(RuntimeError):
    pass


@dataclass(frozen=True)
class ApiEntry:
    """One name in a torchtitan module, with what must hold for it.

    `name` is dotted inside the module ("Trainer.Config"); `fields` must be dataclass fields of it,
    `parameters` parameters of its signature, `assigns` attributes its `__init__` sets (instance attributes
    have no class-level trace), `attributes` plain attributes of it.
    """

    module: str
    name: str
    used_by: str
    fields: tuple[str, ...] = ()
    parameters: tuple[str, ...] = ()
    assigns: tuple[str, ...] = ()
    attributes: tuple[str, ...] = ()
    since: str = IN_0_3_0
    backends: tuple[str, ...] = ALL_BACKENDS
    # Who needs it: the recipes by config function (a trainer checks only its own recipe's names before it
    # starts), and the stage modules that build models outside a trainer (checked by the preflight).
    users: tuple[str, ...] = RECIPES
    # Other modules where some torchtitan keeps the same name, each with when: the entry holds if `module` or
    # any of these has it, and `import_home` imports it from the first that does.
    homes: tuple[Home, ...] = ()
    # The API levels (api_levels.py) whose adapter uses the name: a torchtitan is checked for its own level's.
    levels: tuple[str, ...] = LEVELS

    @property
    def target(self) -> str:
        return f"{self.module}.{self.name}"


TORCHTITAN_API: tuple[ApiEntry, ...] = (
    # ---- the trainer and its config (in_ranks/train_entry.py, in_ranks/recipes.py) ----
    ApiEntry("torchtitan.train", "main", "train_entry.py runs it", since=_since("2025-11-07", "4caa37999", 1995)),
    ApiEntry("torchtitan.trainer", "Trainer.Config", "the recipes return one", fields=("model_spec",),
             since=CONFIG_REFACTOR),
    ApiEntry("torchtitan.trainer", "Trainer.Config", "the recipes set them",
             fields=("hf_assets_path", "dataloader", "training", "parallelism", "optimizer", "lr_scheduler",
                     "checkpoint", "metrics", "debug", "profiler", "loss", "compile"),
             since=_since("2026-04-27", "786e26f8e", 2937)),
    ApiEntry("torchtitan.config", "TrainingConfig", "api_levels.training_config sets them",
             fields=("steps", "mixed_precision_param"), since=CONFIG_REFACTOR),
    ApiEntry("torchtitan.config", "TrainingConfig", "api_levels.training_config sets the batch in rows",
             fields=("local_batch_size", "global_batch_size", "seq_len"), levels=UNFOLDED,
             since=_had("2026-02-23", "9810191bb", 2386, "2026-08-20, when 73aed7f6c (#4121) removed "
                        "local_batch_size, global_batch_size and seq_len")),
    ApiEntry("torchtitan.config", "TrainingConfig", "api_levels.training_config sets the batch in tokens",
             fields=("num_tokens_per_microbatch_per_dp_rank", "num_tokens_per_train_step", "max_context_length"),
             levels=(GRAIN_FOLDED,), since=FOLDED_BATCH),
    ApiEntry("torchtitan.config", "TrainingConfig", "rank_plan.py reads it", users=(RANK_PLAN,), fields=("dtype",),
             since=CONFIG_REFACTOR),
    ApiEntry("torchtitan.config", "ParallelismConfig", "the recipes and rank_plan.py set them",
             users=(*RECIPES, RANK_PLAN),
             fields=("data_parallel_shard_degree", "tensor_parallel_degree", "spmd_backend"),
             since=_since("2026-06-06", "641b5f6b8", 3466)),
    ApiEntry("torchtitan.config", "CompileConfig", "the MoE recipe sets it", users=(MOE,), fields=("enable",),
             since=CONFIG_REFACTOR),
    ApiEntry("torchtitan.config", "CommConfig", "the recipes set them (training.comm_*_timeout_s)",
             fields=("init_timeout_seconds", "train_timeout_seconds"), since=_since("2026-02-23", "9810191bb", 2386)),
    ApiEntry("torchtitan.trainer", "Trainer.Config", "the recipes set the comm timeouts", fields=("comm",),
             since=_since("2026-02-23", "9810191bb", 2386)),
    ApiEntry("torchtitan.config", "DebugConfig", "the recipes set them", fields=("seed", "print_config"),
             since=CONFIG_REFACTOR),
    ApiEntry("torchtitan.config", "TORCH_DTYPE_MAP", "rank_plan.py reads it", users=(RANK_PLAN,),
             since=_since("2025-07-22", "34d815c02", 1442)),
    ApiEntry("torchtitan.tools.profiler", "Profiler.Config", "the recipes set it", fields=("enable_profiling",),
             since=_since("2026-04-17", "de7fc7bd0", 3020)),
    (CHECKPOINT_MANAGER := ApiEntry(
        "torchtitan.components.checkpointer", "CheckpointManager.Config", "the recipes set them",
        fields=("enable", "interval", "initial_load_path", "initial_load_in_hf", "initial_load_model_only",
                "last_save_in_hf", "last_save_model_only", "export_dtype"),
        since=_since("2026-08-17", "6bc2108e9", 4141, "where upstream keeps it now"),
        homes=(Home("torchtitan.components.checkpoint", "from 2026-02-23 (9810191bb, #2386) until 2026-08-19, when "
                    "2e92be1c4 (#4184) removed that import path"),))),
    ApiEntry("torchtitan.components.optimizer", "default_adamw", "the recipes call it", parameters=("lr",),
             since=_since("2026-06-04", "632f67f12", 3269)),
    (LR_SCHEDULERS := ApiEntry(
        "torchtitan.components.optimizer", "LRSchedulersContainer.Config", "the recipes set them",
        fields=("warmup_steps", "decay_ratio", "decay_type", "min_lr_factor"),
        since=_since("2026-08-17", "970fbddb3", 4140, "where upstream keeps it now"),
        homes=(Home("torchtitan.components.lr_scheduler", "until 2026-08-18, when 203f9a806 (#4172) removed that "
                    "import path"),))),
    ApiEntry("torchtitan.components.loss", "ChunkedLossWrapper.Config", "the recipes set it",
             users=(NATIVE, MOE), fields=("loss_fn",),
             since=CHUNKED_LOSS),
    ApiEntry("torchtitan.components.loss", "CrossEntropyLoss.Config", "the recipes set it", users=(NATIVE, MOE),
             fields=("global_vocab_size",), since=_since("2026-06-22", "073221a0a", 3726)),
    ApiEntry("torchtitan.hf_datasets.text_datasets", "HuggingFaceTextDataLoader.Config",
             "api_levels.text_dataloader sets them", fields=("dataset", "dataset_path"), levels=(HF_DATASETS,),
             since=_had("2026-02-23", "9810191bb", 2386, "2026-08-19, when 1b04fc1c3 (#4088) replaced the "
                        "dataloader with grain")),
    ApiEntry("torchtitan.components.data", "GrainDataLoader.Config", "api_levels.text_dataloader sets them",
             fields=("dataset", "shuffle", "repeat"), levels=WITH_GRAIN, since=GRAIN_LOADER),
    ApiEntry("torchtitan.components.data", "ConcatThenSplitPackingConfig", "api_levels.text_dataloader cuts the "
             "corpus into rows with it", fields=("dataset",), levels=WITH_GRAIN, since=GRAIN_LOADER),
    ApiEntry("torchtitan.components.data", "SingleDatasetConfig", "api_levels.text_dataloader sets them",
             fields=("source", "processor", "post_filters"), levels=WITH_GRAIN, since=GRAIN_LOADER),
    ApiEntry("torchtitan.components.data", "HuggingFaceRandomAccessSource.Config", "api_levels.text_dataloader "
             "reads the corpus folder with it", fields=("path", "split"), levels=WITH_GRAIN, since=GRAIN_LOADER),
    ApiEntry("torchtitan.hf_datasets.text_datasets", "TextProcessor.Config", "api_levels.text_dataloader "
             "tokenizes with it", levels=WITH_GRAIN, since=GRAIN_LOADER),
    ApiEntry("torchtitan.components.validate", "Validator.Config", "the native recipe sets them for the convergence "
             "stage's held-out loss", users=(NATIVE,), fields=("enable", "freq", "steps", "dataloader"),
             since=CONFIG_REFACTOR),
    ApiEntry("torchtitan.trainer", "Trainer.Config", "the native recipe sets it for the convergence stage",
             users=(NATIVE,), fields=("validator",), since=CONFIG_REFACTOR),
    ApiEntry("torchtitan.components.metrics", "MetricsProcessor.Config", "titan_metrics.py extends it",
             fields=("log_freq", "enable_tensorboard"), since=CONFIG_REFACTOR),
    ApiEntry("torchtitan.components.metrics", "MetricsProcessor", "titan_metrics.py overrides them after "
             "__init__ (the MFU peak, the logger)", assigns=("gpu_peak_flops", "logger"), since=METRICS_COMPONENT),
    ApiEntry("torchtitan.components.metrics", "BaseLogger", "titan_metrics.py subclasses it",
             since=METRICS_COMPONENT),
    ApiEntry("torchtitan.components.metrics", "LoggerContainer", "titan_metrics.py adds its logger",
             attributes=("add_logger",), since=_since("2025-09-10", "612e4a12d", 1698)),
    # ---- the models (models.py, kernel_numerics, hf_export.py, rank_plan.py) ----
    ApiEntry("torchtitan.models.qwen3.config_registry", "qwen3_32b", "the native and MoE recipes build on it",
             users=(NATIVE, MOE),
             since=CONFIG_REFACTOR),
    ApiEntry("torchtitan.models.qwen3", "model_registry", "the recipes and rank_plan.py call it",
             users=(NATIVE, MOE, RANK_PLAN),
             parameters=("flavor",), since=CONFIG_REFACTOR),
    ApiEntry("torchtitan.models.qwen3", "model_registry", "kernel converters are passed to it", users=(NATIVE, MOE),
             parameters=("converters",), since=CONVERTERS),
    ApiEntry("torchtitan.protocols.model", "ModelConfigConverter", "kernel converters subclass it",
             users=CONVERTER_USERS,
             attributes=("Config",), since=CONVERTERS),
    ApiEntry("torchtitan.models.utils", "validate_converter_order", "replacement.apply_converters calls it, "
             "as model_registry does", users=CONVERTER_USERS, parameters=("converters",), since=CONVERTERS),
    ApiEntry("torchtitan.protocols.module", "Module.Config", "the kernel converters walk the model config "
             "with it", users=CONVERTER_USERS, attributes=("traverse", "build"), since=CONFIG_TRAVERSE),
    ApiEntry("torchtitan.models.common.rope", "CosSinRoPE", "kernels.rope.HFLayoutRoPE subclasses it and "
             "reads its cache lookup",
             users=CONVERTER_USERS, attributes=("_reshape_cache",), since=_private(PER_LAYER_ROPE)),
    ApiEntry("torchtitan.protocols.model_spec", "ModelSpec", "the recipes replace them", users=(NATIVE, MOE),
             fields=("flavor", "model", "post_optimizer_build_fn", "parallelize_fn"), since=CONFIG_REFACTOR),
    ApiEntry("torchtitan.models.qwen3.model", "Qwen3Model.Config", "models.qwen3_decoder sets them",
             users=DECODER_USERS,
             fields=("vocab_size", "dim", "norm", "enable_weight_tying", "tok_embeddings", "lm_head", "layers"),
             attributes=("traverse", "build", "update_from_config", "get_nparams_and_flops"),
             since=CONFIG_TRAVERSE),
    ApiEntry("torchtitan.models.qwen3", "_build_qwen3_layers", "the native recipe and kernel_numerics call it",
             users=(NATIVE, NUMERICS),
             parameters=("fuse_qkv", "n_layers", "dim", "n_heads", "n_kv_heads", "head_dim", "hidden_dim",
                         "attn_backend", "rope"), since=_private(PER_LAYER_ROPE)),
    ApiEntry("torchtitan.models.qwen3", "_build_qwen3_moe_layers", "the MoE recipe and kernel_numerics call it",
             users=(MOE, NUMERICS),
             parameters=("fuse_qkv", "n_layers", "dim", "n_heads", "n_kv_heads", "head_dim", "moe_hidden_dim",
                         "num_experts", "top_k", "attn_backend", "moe_comm_backend", "rope"),
             since=_private(_since("2026-06-24", "3396a4b37", 3714))),
    ApiEntry("torchtitan.models.qwen3", "_qwen3_norm", "models.qwen3_decoder calls it",
             users=DECODER_USERS, parameters=("dim",),
             since=_private(_since("2026-04-03", "4b3347467", 2785))),
    *(ApiEntry("torchtitan.models.qwen3", name, "models.qwen3_decoder uses it",
               users=DECODER_USERS, since=_private(PARAM_INIT))
      for name in ("_EMBEDDING_INIT", "_EMBEDDING_SKIP_INIT", "_LINEAR_INIT")),
    ApiEntry("torchtitan.models.qwen3.state_dict_adapter", "Qwen3StateDictAdapter", "hf_export.py loads "
             "the export with it", users=(EXPORT,), attributes=("from_hf",), since=CONFIG_REFACTOR),
    ApiEntry("torchtitan.models.common", "Embedding.Config", "models.qwen3_decoder sets them", users=DECODER_USERS,
             fields=("num_embeddings", "embedding_dim", "param_init"), since=PARAM_INIT),
    ApiEntry("torchtitan.models.common", "Linear.Config", "models.qwen3_decoder sets them", users=DECODER_USERS,
             fields=("in_features", "out_features", "param_init"), since=PARAM_INIT),
    ApiEntry("torchtitan.models.common", "CosSinRoPE.Config", "api_levels.rope_config sets them",
             users=(NATIVE, MOE, NUMERICS), fields=("dim", "max_seq_len", "theta"), levels=UNFOLDED,
             since=_had("2026-06-05", "02d24f017", 3458, "2026-08-20, when 73aed7f6c (#4121) removed max_seq_len")),
    ApiEntry("torchtitan.models.common", "CosSinRoPE.Config", "api_levels.rope_config sets them",
             users=(NATIVE, MOE, NUMERICS), fields=("dim", "max_context_length", "theta"), levels=(GRAIN_FOLDED,),
             since=FOLDED_BATCH),
    ApiEntry("torchtitan.models.common.nn_modules", "RMSNorm.Config", "the native recipe sets it", users=DECODER_USERS,
             fields=("eps",), since=_since("2026-05-25", "af33f7638", 3398)),
    ApiEntry("torchtitan.models.common.attention", "ScaledDotProductAttention.Config", "recipes.use_sdpa "
             "puts it in every layer", users=(NATIVE, MOE), since=_since("2026-03-31", "261819688", 2761)),
    ApiEntry("torchtitan.models.common.attention", "GQAttention.Config", "recipes.use_sdpa and the parity "
             "check read them", users=(NATIVE, MOE),
             fields=("inner_attention", "n_heads", "n_kv_heads", "head_dim", "rope"), since=PER_LAYER_ROPE),
    ApiEntry("torchtitan.models.common.moe", "GroupedExperts.Config", "kernels/moe.py builds it", users=(MOE, NUMERICS),
             fields=("dim", "hidden_dim", "num_experts"), since=_since("2026-03-17", "378781704", 2615)),
    ApiEntry("torchtitan.models.common.moe", "MoE.Config", "titan_metrics.recording_router_load reads it", users=(MOE,),
             fields=("load_balance_coeff",), since=CONFIG_REFACTOR),
    ApiEntry("torchtitan.models.common.moe", "MoE", "titan_metrics.recording_router_load reads and zeroes "
             "the router's counts", users=(MOE,), assigns=("tokens_per_expert_E", "load_balance_coeff"),
             since=_since("2026-05-27", "200100e7d", 3425)),
    ApiEntry("torchtitan.models.common.config_utils", "decoder_vocab_size", "the recipes call it", users=(NATIVE, MOE),
             since=CHUNKED_LOSS),
    # ---- the transformers modeling backend (recipes.qwen3_hf) ----
    # The dates are the names' own; before af35cfb15 these modules fail to import with transformers 5
    # (HFTransformerModel.Config inherits PretrainedConfig's fields, which are not keyword-only).
    ApiEntry("torchtitan.experiments.transformers_modeling_backend.config_registry",
             "transformers_modeling_backend_full", "the HF recipe builds on it", users=(HF,), since=CONFIG_REFACTOR),
    ApiEntry("torchtitan.experiments.transformers_modeling_backend.configs", "TransformersBackendConfig",
             "the HF recipe sets it", users=(HF,), fields=("hf_model",), since=CONFIG_REFACTOR),
    ApiEntry("torchtitan.experiments.transformers_modeling_backend.model", "HFTransformerModel.init_states",
             "the HF recipe wraps it", users=(HF,), parameters=("buffer_device",), since=PARAM_INIT),
    ApiEntry("torchtitan.experiments.transformers_modeling_backend.model", "HFTransformerModel",
             "the HF recipe's SDPA setting replaces it", users=(HF,), attributes=("get_attention_masks",),
             since=HF_BACKEND_MOE),
    *(ApiEntry("torchtitan.experiments.transformers_modeling_backend.model", name,
               "the HF recipe's SDPA setting and remote-code guard replace it",
               users=(HF,), since=_private(HF_BACKEND_MOE))
      for name in ("_flex_attention_torchtitan", "_ATTN_IMPLEMENTATION", "_REMOTE_CONFIG_DENYLIST")),
    # ---- what the cpu backend and the offline plan patch or call (backends/cpu.py, rank_plan.py) ----
    ApiEntry("torchtitan.tools.utils", "device_type", "the cpu backend's device workaround sets it",
             backends=("cpu",), since=REPO_LAYOUT),
    ApiEntry("torchtitan.tools.utils", "device_module", "the cpu backend's device workaround sets it",
             backends=("cpu",), since=REPO_LAYOUT),
    ApiEntry("torchtitan.tools.utils", "set_default_dtype", "rank_plan.py calls it", users=(RANK_PLAN,),
             since=_since("2025-09-16", "e99e16c91", 1646)),
    ApiEntry("torchtitan.components.metrics", "build_device_memory_monitor", "the cpu backend's memory "
             "workaround replaces it", backends=("cpu",), since=METRICS_COMPONENT),
    ApiEntry("torchtitan.components.metrics", "DeviceMemStats", "the cpu backend's memory workaround "
             "returns it", backends=("cpu",), since=METRICS_COMPONENT),
    ApiEntry("torchtitan.distributed.utils", "set_pg_timeouts", "the cpu backend's barrier workaround "
             "replaces it", parameters=("timeout", "parallel_dims"), backends=("cpu",),
             since=_since("2025-12-17", "183a0d2e7", 1660)),
    ApiEntry("torchtitan.distributed.utils", "init_fake_mode", "rank_plan.py calls it", users=(RANK_PLAN,),
             since=_since("2025-11-25", "d0393b37a", 2057)),
    ApiEntry("torchtitan.distributed", "ParallelDims", "rank_plan.py builds the plan's mesh with it",
             users=(RANK_PLAN,),
             attributes=("from_config", "build_mesh"), since=_since("2026-04-04", "a146a4dec", 2822)),
    ApiEntry("torchtitan.distributed.parallel_dims", "device_type", "rank_plan.py patches it", users=(RANK_PLAN,),
             since=_since("2025-07-14", "6204cdff9", 1384)),
)


# AWS's TorchTitan Neuron tutorial trains Qwen3 with `--module torchtitan_neuron.models.qwen3 --config
# qwen3_8b_tp4_fsdp16_sac` ("Tutorial: Run a basic TorchTitan training on Neuron", date-modified 2026-10-15): on
# neuron the native recipe starts from that config function where the installed fork has it, for the Neuron
# settings AWS ships with it, and from upstream's qwen3_32b otherwise (the cpu backend, a fork without it).
FORK_NATIVE_BASE = ("torchtitan_neuron.models.qwen3", "qwen3_8b_tp4_fsdp16_sac")
UPSTREAM_NATIVE_BASE = ("torchtitan.models.qwen3.config_registry", "qwen3_32b")


def native_base(backend: str) -> tuple[Any, str]:
    """The config function the native recipe starts from on `backend`, and its "module:function" name. The
    fork's module is looked up as torchtitan's --module does (module.config_registry, then the module); a
    fork module that exists but fails to import is an error, not a reason to fall back."""
    if backend == "neuron":
        module, name = FORK_NATIVE_BASE
        for candidate in (f"{module}.config_registry", module):
            try:
                found = importlib.import_module(candidate)
            except ModuleNotFoundError as error:
                if error.name and candidate.startswith(error.name):
                    continue  # that module (or a parent) is not there
                raise
            if hasattr(found, name):
                return getattr(found, name), f"{candidate}:{name}"
    module, name = UPSTREAM_NATIVE_BASE
    return getattr(importlib.import_module(module), name), f"{module}:{name}"


def missing_api(entries: tuple[ApiEntry, ...] = TORCHTITAN_API, backend: str | None = None,
                user: str | None = None) -> list[str]:
    """One message per name, field or parameter in `entries` that the installed torchtitan lacks;
    `backend` leaves out entries that only another backend uses, `user` those that user does not need, and
    the installed torchtitan's API level (api_levels.installed_level) those of the other levels."""
    messages: list[str] = []
    modules: dict[str, Any] = {}
    level = installed_level()
    for entry in entries:
        if (backend is not None and backend not in entry.backends) or (user is not None and user not in entry.users):
            continue
        if level not in entry.levels:
            continue
        messages += _entry_problems(entry, modules)
    return messages


def check_torchtitan_api(backend: str | None = None, entries: tuple[ApiEntry, ...] = TORCHTITAN_API,
                         user: str | None = None) -> None:
    """Raises TorchtitanApiError when the installed torchtitan predates the config API (config_api_problem),
    or listing everything `missing_api` finds for `user` (a recipe's config function; None: every user);
    silent when nothing is missing."""
    refused = config_api_problem()
    if refused:
        raise TorchtitanApiError(refused)
    missing = missing_api(entries, backend, user)
    if missing:
        who = f"the recipe {user}" if user in RECIPES else (user or "this project")
        raise TorchtitanApiError(
            problem_list(f"the installed torchtitan ({installed_torchtitan()}) lacks {len(missing)} name(s) {who} "
                         "uses", missing)
        )


def missing_by_user(backend: str | None = None, entries: tuple[ApiEntry, ...] = TORCHTITAN_API) -> dict[str, list[str]]:
    """missing_api per user (each recipe, then the stage modules): what each would be refused for."""
    users = dict.fromkeys(user for entry in entries for user in entry.users)
    return {user: missing_api(entries, backend, user) for user in sorted(users, key=_user_order)}


def _user_order(user: str) -> tuple[int, str]:
    return (RECIPES.index(user) if user in RECIPES else len(RECIPES), user)


def config_api_problem() -> str | None:
    """Why the installed torchtitan cannot run any recipe here at all, or None: releases before upstream's
    config refactor (2026-02-23, 9810191bb, #2386), such as 0.2.2 on PyPI, configure the trainer with TOML
    files (torchtitan.config.job_config.JobConfig) and have no Python config functions (--module/--config,
    torchtitan.trainer.Trainer.Config), which every recipe here is."""
    import importlib.util

    try:
        has_trainer = importlib.util.find_spec("torchtitan.trainer") is not None
        has_job_config = importlib.util.find_spec("torchtitan.config.job_config") is not None
    except ImportError as error:  # torchtitan itself, or its config package, cannot be imported
        return f"torchtitan cannot be imported: {type(error).__name__}: {error}"
    if not has_trainer and has_job_config:
        return (f"the installed torchtitan ({installed_torchtitan()}) predates upstream's config refactor of "
                "2026-02-23 (9810191bb, #2386): it is configured by TOML files (torchtitan.config.job_config), and the "
                "recipes here are Python config functions for --module/--config (torchtitan.trainer.Trainer.Config). "
                "Install torchtitan 0.3.0 (workflow/envs/cpu.txt) or the TorchTitan Neuron fork "
                "(workflow/envs/neuron-sdk/).")
    return None


def _entry_problems(entry: ApiEntry, modules: dict[str, Any]) -> list[str]:
    """What `entry` finds missing in its module, or, where it names other homes, in the first home that has
    the name (all of them failing: the main module's problems, with where else it was looked for)."""
    problems = _home_problems(entry, entry.module, modules)
    for home in entry.homes if problems else ():
        if not _home_problems(entry, home.module, modules):
            return []
    if problems and entry.homes:
        elsewhere = "; ".join(f"{home.module} ({home.when})" for home in entry.homes)
        problems = [f"{problem}; not in {elsewhere} either" for problem in problems]
    return problems


def import_home(entry: ApiEntry) -> Any:
    """The entry's top-level name (e.g. CheckpointManager for "CheckpointManager.Config") from the first of
    its module and homes that holds everything the entry needs; TorchtitanApiError when none does."""
    modules: dict[str, Any] = {}
    for module in (entry.module, *(home.module for home in entry.homes)):
        if not _home_problems(entry, module, modules):
            return getattr(modules[module], entry.name.split(".")[0])
    raise TorchtitanApiError(f"the installed torchtitan ({installed_torchtitan()}): "
                             + "; ".join(_entry_problems(entry, modules)))


def _home_problems(entry: ApiEntry, module_name: str, modules: dict[str, Any]) -> list[str]:
    entry = dataclasses.replace(entry, module=module_name)
    reason = f"{entry.used_by}; {entry.since}"
    module = _import(entry.module, modules)
    if isinstance(module, Exception):
        return [f"{entry.target}: module {entry.module} cannot be imported "
                f"({type(module).__name__}: {module}) ({reason})"]
    obj = module
    for part in entry.name.split("."):
        if not hasattr(obj, part):
            return [f"{entry.module} has no {entry.name} ({reason})"]
        obj = getattr(obj, part)
    problems = []
    if entry.fields:
        names = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else None
        if names is None:
            problems.append(f"{entry.target} is not a dataclass; expected fields {', '.join(entry.fields)} "
                            f"({reason})")
        else:
            problems += [f"{entry.target} has no field {name} ({reason})" for name in entry.fields
                         if name not in names]
    if entry.parameters:
        parameters = _parameters(obj)
        problems += [f"{entry.target} has no parameter {name} ({reason})" for name in entry.parameters
                     if parameters is not None and name not in parameters]
    if entry.assigns:
        source = _init_source(obj)
        problems += [f"{entry.target}.__init__ does not set self.{name} ({reason})" for name in entry.assigns
                     if source is not None and not _sets(source, name)]
    problems += [f"{entry.target} has no attribute {name} ({reason})" for name in entry.attributes
                 if not hasattr(obj, name)]
    return problems


def _import(name: str, modules: dict[str, Any]) -> Any:
    if name not in modules:
        try:
            modules[name] = importlib.import_module(name)
        except Exception as error:  # a module that fails on import is as missing as an absent one
            modules[name] = error
    return modules[name]


def _parameters(obj: Any) -> set[str] | None:
    """Names of obj's parameters; None when it takes **kwargs (any keyword passes) or has no signature."""
    try:
        parameters = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return None
    return set(parameters)


def _sets(source: str, name: str) -> bool:
    """`self.name = ...`, or a register_buffer/register_parameter call naming it."""
    return f"self.{name}" in source or f'"{name}"' in source or f"'{name}'" in source


def _init_source(cls: Any) -> str | None:
    try:
        return inspect.getsource(cls.__init__)
    except (OSError, TypeError):
        return None  # no source to read (a compiled build): nothing to check


def installed_torchtitan() -> str:
    """The torchtitan that `import torchtitan` finds, by its distribution's version; a source tree ahead of the
    installed distribution on the path (PYTHONPATH) is named by its folder instead."""
    import importlib.util
    from importlib.metadata import PackageNotFoundError, distribution

    spec = importlib.util.find_spec("torchtitan")  # finds, does not import
    imported = Path(spec.origin).resolve().parent if spec and spec.origin else None
    try:
        found = distribution("torchtitan")
    except PackageNotFoundError:
        found = None
    if found is not None and (imported is None or Path(found.locate_file("torchtitan")).resolve() == imported):
        return f"torchtitan {found.version}"
    return f"torchtitan from {imported.parent}, no distribution metadata" if imported else "no torchtitan"
