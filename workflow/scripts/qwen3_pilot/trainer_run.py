"""The run a training stage asks its ranks for: one torch-free dataclass that the stage writes into the run's
recipe file and the recipes read in every rank (titan/in_ranks/recipes.py), with the file names both sides share.

Every setting reaches torchtitan's trainer through it, and nothing else: no command-line override. The control
run on random init and the benchmark's runs are TrainerRuns of their own (use_checkpoint, steps,
compile_backend), so a launch record (launch.json) names one file that says everything the ranks ran with.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .artifacts import write_json

RECIPE_ENV = "QWEN3_PILOT_RECIPE"  # names the TrainerRun's file, for every rank
LAUNCH_RECORD = "launch.json"  # in the run folder: the command and environment of the launch (launch.py)
METRICS_FILE = "metrics.jsonl"  # in the run folder: torchtitan's per-step metrics (titan/in_ranks/titan_metrics.py)
PARITY_FILE = "parity.json"  # beside the recipe: the built model against config.json (parity.check_parity)
ROUTER_LOAD_FILE = "router_load.jsonl"  # tokens per expert per layer per step (titan_metrics.recording_router_load)


class TrainerRunError(ValueError):
    pass


@dataclass(frozen=True, kw_only=True)
class TrainerRun:
    stage: str  # the stage (or benchmarked recipe) whose run this is
    backend: str  # cpu or neuron: which native recipe base (titan_api.native_base)
    checkpoint: str  # the fetched checkpoint's folder: config.json, tokenizer, safetensors
    dataset: str  # torchtitan's dataset loader name (c4_test)
    dataset_path: str  # the folder fetch_corpus wrote
    steps: int
    seq_len: int
    local_batch_size: int
    global_batch_size: int
    seed: int
    lr: float
    warmup_steps: int
    mixed_precision_param: str
    export_dtype: str
    attention: str  # sdpa or flex
    comm_init_timeout_s: int  # torchtitan's comm timeouts: until the first step ends, and after it (the export)
    comm_train_timeout_s: int
    peak_flops_per_rank: float  # MFU's denominator (verify_ranks' record)
    parity_path: str  # where rank 0 writes the parity table (PARITY_FILE)
    native_flavor: str | None = None  # the native recipe's registered flavor; None: sized from config.json
    accepted_differences: tuple[str, ...] = ()  # parity fields allowed to differ (their reasons are the judge's)
    replacements: tuple[dict[str, str], ...] = ()  # kernel replacements: {kernel, layers, module} each
    # False: torchtitan's checkpointing off: random init, nothing saved or exported (the control run, the benchmark).
    use_checkpoint: bool = True
    compile_backend: str | None = None  # torch.compile with this backend; None: eager
    moe: dict[str, Any] | None = None  # the reduced MoE's spec (moe.model_spec)
    router_load_path: str | None = None  # where the reduced MoE's router load goes (ROUTER_LOAD_FILE)
    # torchtitan's validator on a held-out folder (the convergence stage): its loss after step 1 and every
    # `validation_every` steps, over `validation_batches` batches; None: no validation.
    validation_path: str | None = None
    validation_every: int = 0
    validation_batches: int = 0

    # The files the ranks write outside the run folder: a relaunch into a scratch folder moves them too.
    RANK_OUTPUTS = ("parity_path", "router_load_path")

    def write(self, path: Path) -> None:
        write_json(path, dataclasses.asdict(self))

    @classmethod
    def read(cls, path: Path) -> TrainerRun:
        """The run a stage wrote; a key this code does not know, or one missing, names the file and the key."""
        try:
            values = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise TrainerRunError(f"{path}: cannot read the trainer run: {error}") from error
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(fields))
        missing = sorted(name for name, f in fields.items() if name not in values
                         and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        if unknown or missing:
            raise TrainerRunError(f"{path}: not a trainer run this code reads: unknown keys {unknown}, missing keys "
                                  f"{missing} (written by another version of the pilot? rerun the stage)")
        for name in ("accepted_differences", "replacements"):
            values[name] = tuple(values.get(name, ()))
        return cls(**values)

    def replace(self, **changes: Any) -> TrainerRun:
        return dataclasses.replace(self, **changes)


def export_dir(run_dir: Path, steps: int) -> Path:
    """Where torchtitan's last_save_in_hf writes the Hugging Face export of step `steps`."""
    return Path(run_dir) / "checkpoint" / f"step-{steps}"


class TrainingError(RuntimeError):
    """A training stage's launch or check failed (raised by its measuring job and by its judge: here, where both
    can import it without importing each other)."""
