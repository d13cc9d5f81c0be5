"""Every torchtitan class, config field and function this project uses, checked against the installed
torchtitan before a trainer starts.

A version string says nothing about the API: the aws-neuron torchtitan fork reports "0.2.2+neuron.1",
and upstream kept "0.2.2" from the February 2026 config refactor until at least August 2026, while fields
the recipes set arrived in between (DESIGN.md, "Neuron facts"). So the check looks for each name itself.

Importing this module imports neither torch nor torchtitan; `missing_api` imports the modules it checks.
Add an `ApiEntry` to `TORCHTITAN_API` for anything new the project starts to use (a kernel converter,
another config field); `since` says where the name is known from, for the error message.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from dataclasses import dataclass
from typing import Any

# Where a name is known from, when no upstream date could be established from the project's sources.
IN_0_3_0 = "present in torchtitan 0.3.0 (PyPI); upstream date not established"
CONFIG_REFACTOR = "upstream has it since the February 2026 config refactor (--module/--config)"
PRIVATE = "a private name in torchtitan 0.3.0 (PyPI): it may move without notice"
ALL_BACKENDS = ("cpu", "neuron")


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

    @property
    def target(self) -> str:
        return f"{self.module}.{self.name}"


TORCHTITAN_API: tuple[ApiEntry, ...] = (
    # ---- the trainer and its config (in_ranks/train_entry.py, in_ranks/recipes.py) ----
    ApiEntry("torchtitan.train", "main", "train_entry.py runs it", since=CONFIG_REFACTOR),
    ApiEntry("torchtitan.trainer", "Trainer.Config", "the recipes return one", fields=("model_spec",),
             since=CONFIG_REFACTOR),
    ApiEntry("torchtitan.trainer", "Trainer.Config", "the recipes set them",
             fields=("hf_assets_path", "dataloader", "training", "parallelism", "optimizer", "lr_scheduler",
                     "checkpoint", "metrics", "debug", "profiler", "loss", "compile")),
    ApiEntry("torchtitan.config", "TrainingConfig", "the recipes set it", fields=("disable_cuda_graphs",),
             since="upstream has it since 2026-08-13"),
    ApiEntry("torchtitan.config", "TrainingConfig", "the recipes set them",
             fields=("local_batch_size", "global_batch_size", "seq_len", "steps", "mixed_precision_param")),
    ApiEntry("torchtitan.config", "TrainingConfig", "rank_plan.py reads it", fields=("dtype",)),
    ApiEntry("torchtitan.config", "ParallelismConfig", "the recipes and rank_plan.py set them",
             fields=("data_parallel_shard_degree", "tensor_parallel_degree", "spmd_backend")),
    ApiEntry("torchtitan.config", "CompileConfig", "the MoE recipe sets it", fields=("enable",)),
    ApiEntry("torchtitan.config", "DebugConfig", "the recipes set them", fields=("seed", "print_config")),
    ApiEntry("torchtitan.config", "TORCH_DTYPE_MAP", "rank_plan.py reads it"),
    ApiEntry("torchtitan.tools.profiler", "Profiler.Config", "the recipes set it", fields=("enable_profiling",)),
    ApiEntry("torchtitan.components.checkpoint", "CheckpointManager.Config", "the recipes set them",
             fields=("enable", "interval", "initial_load_path", "initial_load_in_hf", "initial_load_model_only",
                     "last_save_in_hf", "last_save_model_only", "export_dtype")),
    ApiEntry("torchtitan.components.optimizer", "default_adamw", "the recipes call it", parameters=("lr",)),
    ApiEntry("torchtitan.components.optimizer", "LRSchedulersContainer.Config", "the recipes set them",
             fields=("warmup_steps", "decay_ratio", "decay_type", "min_lr_factor")),
    ApiEntry("torchtitan.components.loss", "ChunkedLossWrapper.Config", "the recipes set it", fields=("loss_fn",)),
    ApiEntry("torchtitan.components.loss", "CrossEntropyLoss.Config", "the recipes set it",
             fields=("global_vocab_size",)),
    ApiEntry("torchtitan.hf_datasets.text_datasets", "HuggingFaceTextDataLoader.Config", "the recipes set them",
             fields=("dataset", "dataset_path")),
    ApiEntry("torchtitan.components.metrics", "MetricsProcessor.Config", "titan_metrics.py extends it",
             fields=("log_freq", "enable_tensorboard")),
    ApiEntry("torchtitan.components.metrics", "MetricsProcessor", "titan_metrics.py overrides them after "
             "__init__ (the MFU peak, the logger)", assigns=("gpu_peak_flops", "logger")),
    ApiEntry("torchtitan.components.metrics", "BaseLogger", "titan_metrics.py subclasses it"),
    ApiEntry("torchtitan.components.metrics", "LoggerContainer", "titan_metrics.py adds its logger",
             attributes=("add_logger",)),
    # ---- the models (models.py, numerics.py, export_reload.py, rank_plan.py) ----
    ApiEntry("torchtitan.models.qwen3.config_registry", "qwen3_32b", "the native and MoE recipes build on it",
             since=CONFIG_REFACTOR),
    ApiEntry("torchtitan.models.qwen3", "model_registry", "the recipes and rank_plan.py call it",
             parameters=("flavor",)),
    ApiEntry("torchtitan.models.qwen3", "model_registry", "kernel converters are passed to it",
             parameters=("converters",)),
    ApiEntry("torchtitan.protocols.model", "ModelConfigConverter", "kernel converters subclass it",
             attributes=("Config",)),
    ApiEntry("torchtitan.models.utils", "validate_converter_order", "replacement.apply_converters calls it, "
             "as model_registry does", parameters=("converters",)),
    ApiEntry("torchtitan.protocols.module", "Module.Config", "the kernel converters walk the model config "
             "with it", attributes=("traverse", "build")),
    ApiEntry("torchtitan.models.common.rope", "CosSinRoPE", "kernels.rope.HFLayoutRoPE subclasses it and "
             "reads its cache lookup", attributes=("_reshape_cache",), since=PRIVATE),
    ApiEntry("torchtitan.protocols.model_spec", "ModelSpec", "the recipes replace them",
             fields=("flavor", "model", "post_optimizer_build_fn", "parallelize_fn")),
    ApiEntry("torchtitan.models.qwen3.model", "Qwen3Model.Config", "models.qwen3_decoder sets them",
             fields=("vocab_size", "dim", "norm", "enable_weight_tying", "tok_embeddings", "lm_head", "layers"),
             attributes=("traverse", "build", "update_from_config", "get_nparams_and_flops")),
    ApiEntry("torchtitan.models.qwen3", "_build_qwen3_layers", "the native recipe and numerics.py call it",
             parameters=("fuse_qkv", "n_layers", "dim", "n_heads", "n_kv_heads", "head_dim", "hidden_dim",
                         "attn_backend", "rope"), since=PRIVATE),
    ApiEntry("torchtitan.models.qwen3", "_build_qwen3_moe_layers", "the MoE recipe and numerics.py call it",
             parameters=("fuse_qkv", "n_layers", "dim", "n_heads", "n_kv_heads", "head_dim", "moe_hidden_dim",
                         "num_experts", "top_k", "attn_backend", "moe_comm_backend", "rope"), since=PRIVATE),
    ApiEntry("torchtitan.models.qwen3", "_qwen3_norm", "models.qwen3_decoder calls it", parameters=("dim",),
             since=PRIVATE),
    *(ApiEntry("torchtitan.models.qwen3", name, "models.qwen3_decoder uses it", since=PRIVATE)
      for name in ("_EMBEDDING_INIT", "_EMBEDDING_SKIP_INIT", "_LINEAR_INIT")),
    ApiEntry("torchtitan.models.qwen3.state_dict_adapter", "Qwen3StateDictAdapter", "export_reload.py loads "
             "the export with it", attributes=("from_hf",)),
    ApiEntry("torchtitan.models.common", "Embedding.Config", "models.qwen3_decoder sets them",
             fields=("num_embeddings", "embedding_dim", "param_init")),
    ApiEntry("torchtitan.models.common", "Linear.Config", "models.qwen3_decoder sets them",
             fields=("in_features", "out_features", "param_init")),
    ApiEntry("torchtitan.models.common", "CosSinRoPE.Config", "the recipes and numerics.py set them",
             fields=("dim", "max_seq_len", "theta")),
    ApiEntry("torchtitan.models.common.nn_modules", "RMSNorm.Config", "the native recipe sets it",
             fields=("eps",)),
    ApiEntry("torchtitan.models.common.attention", "ScaledDotProductAttention.Config", "recipes.use_sdpa "
             "puts it in every layer"),
    ApiEntry("torchtitan.models.common.attention", "GQAttention.Config", "recipes.use_sdpa and the parity "
             "check read them",
             fields=("inner_attention", "n_heads", "n_kv_heads", "head_dim", "rope")),
    ApiEntry("torchtitan.models.common.moe", "GroupedExperts.Config", "kernels/moe.py builds it",
             fields=("dim", "hidden_dim", "num_experts")),
    ApiEntry("torchtitan.models.common.moe", "MoE.Config", "titan_metrics.recording_router_load reads it",
             fields=("load_balance_coeff",)),
    ApiEntry("torchtitan.models.common.moe", "MoE", "titan_metrics.recording_router_load reads and zeroes "
             "the router's counts", assigns=("tokens_per_expert_E", "load_balance_coeff")),
    ApiEntry("torchtitan.models.common.config_utils", "decoder_vocab_size", "the recipes call it"),
    # ---- the transformers modeling backend (recipes.qwen3_hf) ----
    ApiEntry("torchtitan.experiments.transformers_modeling_backend.config_registry",
             "transformers_modeling_backend_full", "the HF recipe builds on it"),
    ApiEntry("torchtitan.experiments.transformers_modeling_backend.configs", "TransformersBackendConfig",
             "the HF recipe sets it", fields=("hf_model",)),
    ApiEntry("torchtitan.experiments.transformers_modeling_backend.model", "HFTransformerModel.init_states",
             "the HF recipe wraps it", parameters=("buffer_device",)),
    ApiEntry("torchtitan.experiments.transformers_modeling_backend.model", "HFTransformerModel",
             "the HF recipe's SDPA setting replaces it", attributes=("get_attention_masks",)),
    *(ApiEntry("torchtitan.experiments.transformers_modeling_backend.model", name,
               "the HF recipe's SDPA setting and remote-code guard replace it", since=PRIVATE)
      for name in ("_flex_attention_torchtitan", "_ATTN_IMPLEMENTATION", "_REMOTE_CONFIG_DENYLIST")),
    # ---- what the cpu backend and the offline plan patch or call (backends/cpu.py, rank_plan.py) ----
    ApiEntry("torchtitan.tools.utils", "device_type", "the cpu backend's device workaround sets it",
             backends=("cpu",)),
    ApiEntry("torchtitan.tools.utils", "device_module", "the cpu backend's device workaround sets it",
             backends=("cpu",)),
    ApiEntry("torchtitan.tools.utils", "set_default_dtype", "rank_plan.py calls it"),
    ApiEntry("torchtitan.components.metrics", "build_device_memory_monitor", "the cpu backend's memory "
             "workaround replaces it", backends=("cpu",)),
    ApiEntry("torchtitan.components.metrics", "DeviceMemStats", "the cpu backend's memory workaround "
             "returns it", backends=("cpu",)),
    ApiEntry("torchtitan.distributed.utils", "set_pg_timeouts", "the cpu backend's barrier workaround "
             "replaces it", parameters=("timeout", "parallel_dims"), backends=("cpu",)),
    ApiEntry("torchtitan.distributed.utils", "init_fake_mode", "rank_plan.py calls it"),
    ApiEntry("torchtitan.distributed", "ParallelDims", "rank_plan.py builds the plan's mesh with it",
             attributes=("from_config", "build_mesh")),
    ApiEntry("torchtitan.distributed.parallel_dims", "device_type", "rank_plan.py patches it"),
)


def missing_api(entries: tuple[ApiEntry, ...] = TORCHTITAN_API, backend: str | None = None) -> list[str]:
    """One message per name, field or parameter in `entries` that the installed torchtitan lacks;
    `backend` leaves out entries that only another backend uses."""
    messages: list[str] = []
    modules: dict[str, Any] = {}
    for entry in entries:
        if backend is not None and backend not in entry.backends:
            continue
        messages += _entry_problems(entry, modules)
    return messages


def check_torchtitan_api(backend: str | None = None, entries: tuple[ApiEntry, ...] = TORCHTITAN_API) -> None:
    """Raises TorchtitanApiError listing everything `missing_api` finds; silent when nothing is missing."""
    missing = missing_api(entries, backend)
    if missing:
        raise TorchtitanApiError(
            f"the installed torchtitan ({installed_torchtitan()}) lacks {len(missing)} name(s) this project "
            "uses:\n  - " + "\n  - ".join(missing)
        )


def _entry_problems(entry: ApiEntry, modules: dict[str, Any]) -> list[str]:
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
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"torchtitan {version('torchtitan')}"
    except PackageNotFoundError:
        return "torchtitan, no distribution metadata"
