"""The torchtitan API levels the recipes run on, one small adapter each, chosen by what the installed torchtitan has.

The recipes ask for the same run on every level: the same corpus folder, unshuffled and split into contiguous
per-rank shards; rows of `seq_len` tokens; `local_batch_size` rows per rank and step; the same RoPE table. What
differs is how a torchtitan spells that:

- "hf_datasets": `HuggingFaceTextDataLoader` and TrainingConfig's `local_batch_size`, `global_batch_size` and
  `seq_len`; RoPE's table length is `max_seq_len` (torchtitan 0.3.0, and upstream until its grain dataloader).
- "grain": Google's grain behind `GrainDataLoader`, the corpus read by `HuggingFaceRandomAccessSource` and cut
  into rows by `ConcatThenSplitPackingConfig`; the batch fields as before.
- "grain_folded": the batch dimension folded into the tokens: TrainingConfig counts tokens
  (`num_tokens_per_microbatch_per_dp_rank`, `num_tokens_per_train_step`) up to `max_context_length`, RoPE's
  table length is `max_context_length`, and attention sees (tokens, heads, head_dim).

Upstream's dates and commits for each level: docs/torchtitan-compat.md. Importing this module imports neither
torch nor torchtitan; `installed_level()` and the builders import torchtitan.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from typing import Any

HF_DATASETS, GRAIN, GRAIN_FOLDED = "hf_datasets", "grain", "grain_folded"
LEVELS = (HF_DATASETS, GRAIN, GRAIN_FOLDED)
UNFOLDED = (HF_DATASETS, GRAIN)  # the batch in rows: local_batch_size x seq_len
WITH_GRAIN = (GRAIN, GRAIN_FOLDED)


@functools.cache  # one torchtitan per process
def installed_level() -> str:
    """The level of the torchtitan that `import torchtitan` finds: grain's dataloader package
    (torchtitan.components.data, found without importing it, so a missing `grain` shows up as that, not as a
    different level), and whether TrainingConfig counts tokens."""
    if importlib.util.find_spec("torchtitan.components.data") is None:
        return HF_DATASETS
    try:
        from torchtitan.config import TrainingConfig
    except ImportError:
        return GRAIN  # the API check names what fails to import
    return GRAIN_FOLDED if "max_context_length" in _field_names(TrainingConfig) else GRAIN


def _field_names(config_class) -> set[str]:
    return {field.name for field in dataclasses.fields(config_class)}


def training_config(recipe, level: str | None = None):
    """TrainingConfig for the TrainerRun `recipe`: its batch on this level, its steps and parameter dtype, and
    CUDA graphs off where the torchtitan has the switch (without it there are none: the same behaviour)."""
    from torchtitan.config import TrainingConfig

    level = level or installed_level()
    if level == GRAIN_FOLDED:
        # -1 is torchtitan's own "one gradient-accumulation step" on both spellings.
        per_step = recipe.global_batch_size * recipe.seq_len if recipe.global_batch_size > 0 else -1
        batch = {"num_tokens_per_microbatch_per_dp_rank": recipe.local_batch_size * recipe.seq_len,
                 "num_tokens_per_train_step": per_step, "max_context_length": recipe.seq_len}
    else:
        batch = {"local_batch_size": recipe.local_batch_size, "global_batch_size": recipe.global_batch_size,
                 "seq_len": recipe.seq_len}
    if "disable_cuda_graphs" in _field_names(TrainingConfig):
        batch["disable_cuda_graphs"] = True
    return TrainingConfig(steps=recipe.steps, mixed_precision_param=recipe.mixed_precision_param, **batch)


def text_dataloader(dataset: str, path: str, *, validation: bool = False, level: str | None = None):
    """The dataloader config that reads the corpus folder `path` (JSON lines with a "text" field, as
    fetch_corpus writes it), in order, each rank a contiguous shard; `dataset` is torchtitan's loader name on
    the hf_datasets level. A validation loader reads its folder once instead of repeating it."""
    level = level or installed_level()
    if level == HF_DATASETS:
        from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader

        return HuggingFaceTextDataLoader.Config(dataset=dataset, dataset_path=path)
    from torchtitan.components.data import (
        ConcatThenSplitPackingConfig,
        GrainDataLoader,
        HuggingFaceRandomAccessSource,
        SingleDatasetConfig,
    )
    from torchtitan.hf_datasets.text_datasets import TextProcessor

    documents = SingleDatasetConfig(
        source=HuggingFaceRandomAccessSource.Config(path=path, split="train"),
        processor=TextProcessor.Config(),
        post_filters=(_is_sample,),
    )
    return GrainDataLoader.Config(dataset=ConcatThenSplitPackingConfig(dataset=documents), shuffle=False,
                                  repeat=not validation)


def _is_sample(sample: Any) -> bool:
    """TextProcessor's None for a document under two tokens is dropped, as torchtitan's own datasets do."""
    return sample is not None


def rope_length_field(level: str | None = None) -> str:
    return "max_context_length" if (level or installed_level()) == GRAIN_FOLDED else "max_seq_len"


def rope_config(*, dim: int, length: int, config_class=None, level: str | None = None, **values: Any):
    """torchtitan's CosSinRoPE.Config (or `config_class`, a subclass of it) with a table of `length` rows and
    the other `values` (theta, ...)."""
    if config_class is None:
        from torchtitan.models.common import CosSinRoPE

        config_class = CosSinRoPE.Config
    return config_class(dim=dim, **{rope_length_field(level): length}, **values)


def rope_length(rope) -> int:
    """The table length of a built RoPE config, whichever field this torchtitan names it by."""
    return getattr(rope, rope_length_field())
