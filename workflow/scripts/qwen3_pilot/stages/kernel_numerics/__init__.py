"""Stage kernel_numerics: the kernels against PyTorch per op, dtype and shape, and the replaced model against the
plain one. This job measures (measured.json); rule judge holds the figures to the tolerances (judging.py).

- rope_checks.py: the RoPE replacement against torchtitan's RoPE; the NKI kernel's sequence-length rule firing;
- experts_checks.py: the grouped-matmul experts against a per-expert loop;
- tiny_models.py: tiny torchtitan Qwen3 models trained with and without the replacements;
- compile_checks.py: those models under torch.compile against eager;
- comparison.py: what each comparison row records; judging.py: the tolerances and verdicts.

Settings: config `kernel_numerics` without its tolerances (config.stage_measuring: rope and moe shapes and dtypes,
the tiny models trained, torch.compile's check; every key and its default, with the reasons, in the config
schema), plus what the stage adds: `kernel_limits` (the backend's rules for what its kernels take, whose firing the
stage checks), `device` (the backend's; its kernels are installed first) and `compile.cache_dir`. Nothing here imports
torch at module level: the stage fixes inductor's cache folder before torch._dynamo is imported.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...problems import problem_list
from .comparison import largest_per_dtype

_log = logging.getLogger(__name__)


class MeasurementError(RuntimeError):
    pass


def run(
    *, backend_config: dict[str, Any], settings: dict[str, Any], cache_root: str, measured_path: Path, log=None
) -> dict[str, Any]:
    """Stage `kernel_numerics` on the backend's device, with the backend's kernels installed (on neuron the
    NKI rope_hf kernel; the stage fails at once, naming what is missing, without the Neuron packages)."""
    from ...backends import apply_device_process_env, backend_module, make_backend
    from ...stage_progress import record_measured
    from ...summary import StageMeasurement

    backend = backend_config["backend"]
    cache_root = Path(cache_root).resolve()
    device_backend = make_backend(backend_config, str(cache_root))
    # This process uses the device itself, not through torchrun's ranks: it needs what they get from the
    # launcher (on neuron the compile caches under the project and the LNC) before the kernels load the runtime.
    apply_device_process_env(device_backend)
    module = backend_module(backend)
    installed = module.install_kernels()
    device = device_backend.device_type
    cache_dir = str(cache_root / "torchinductor")
    config = {**settings, "kernel_limits": module.kernel_limits(backend_config), "device": device,
              "compile": {**settings["compile"], "cache_dir": cache_dir}}
    figures = {**measure(config, log=log), "implementations": installed}
    record_measured(**figures)
    problems = intrinsic_problems(figures, settings["train"])
    if problems:  # no tolerance decides these: the rule did not fire, or a converter replaced the wrong count
        raise MeasurementError(problem_list("kernel_numerics failed", problems))
    return StageMeasurement(stage="kernel_numerics", backend=backend, figures=figures).write(Path(measured_path))


def measure(config: dict[str, Any], log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Everything the stage measures, as the figures of its measured.json."""
    from .compile_checks import inductor_cache

    # Before anything imports torchtitan (and with it torch._dynamo, which fixes the cache folder).
    with inductor_cache(config["compile"].get("cache_dir")):
        return _measure(config, log or _log.info)


def _measure(config: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
    from .compile_checks import compile_check
    from .experts_checks import moe_numerics
    from .rope_checks import rope_numerics, seq_len_rule_check
    from .tiny_models import replaced_model_trains, token_batches

    train, device = config["train"], config["device"]
    rope_cfg, moe_cfg = config["rope"], config["moe"]

    rope_rows = rope_numerics(rope_cfg["shapes"], rope_cfg["dtypes"], theta=rope_cfg["theta"], device=device)
    log(f"rope: {len(rope_rows)} rows, largest diff per dtype {largest_per_dtype(rope_rows)}")
    moe_rows = moe_numerics(moe_cfg["shapes"], moe_cfg["dtypes"], device=device)
    log(f"moe: {len(moe_rows)} rows, largest diff per dtype {largest_per_dtype(moe_rows)}")
    rule = seq_len_rule_check(config["kernel_limits"].get("rope_hf"), device)
    log(f"rope_hf's sequence rule: {rule['verdict']} ({rule['bad']['error']})" if rule["applies"]
        else "rope_hf's sequence rule: none on this backend")
    trained = replaced_model_trains(train, log=log, device=device)

    batches = {
        kind: token_batches(
            1, train["batch"], train["seq_len"], train[kind]["vocab"], train["seed"] + 100
        )[0][0].to(device)
        for kind in ("dense", "moe")
    }
    compiled = compile_check(trained["models"], config["compile"], batches.__getitem__)
    for kind, result in compiled["models"].items():
        log(f"compile {kind} ({result['backend']}, {result['seconds']} s): "
            f"logits diff {result['logits_max_abs_diff']:.3g}, grad diff {result['grad_max_abs_diff']:.3g}")
    return {
        "numerics": [{"section": "rope", **row} for row in rope_rows] + [{"section": "moe", **row} for row in moe_rows],
        "largest_diff_per_dtype": {"rope": largest_per_dtype(rope_rows), "moe": largest_per_dtype(moe_rows)},
        "seq_len_rule": rule,
        "replacement_counts": trained["replacement_counts"],
        "replaced_model_trains": trained["trains"],
        "compile": compiled,
        "device": device,
    }


def intrinsic_problems(figures: dict[str, Any], train: dict[str, Any]) -> list[str]:
    """What fails the measurement itself, with no threshold to judge: the sequence-length rule not firing (or
    firing on a conforming length), a replacement count other than one per layer."""
    from .rope_checks import seq_len_rule_problems
    from .tiny_models import count_problems

    return seq_len_rule_problems(figures["seq_len_rule"]) + count_problems(figures["replacement_counts"], train)
