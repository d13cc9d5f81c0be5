"""Stage kernel_numerics: the kernels against PyTorch per op, dtype and shape, and the replaced model against the
plain one."""

from __future__ import annotations

from typing import Any

from ..numerics import NumericsError, _largest_per_dtype, kernel_numerics


def run(
    *, backend_config: dict[str, Any], settings: dict[str, Any], cache_root: str, results_path, summary_path, log=None
) -> dict[str, Any]:
    """Stage `kernel_numerics` on the backend's device, with the backend's kernels installed (on neuron the
    NKI rope_hf kernel; the stage fails at once, naming what is missing, without the Neuron packages)."""
    from pathlib import Path

    from ..artifacts import write_json
    from ..backends import apply_device_process_env, backend_module, make_backend
    from ..stage_progress import record_measured
    from ..summary import StageSummary

    backend = backend_config["backend"]
    lnc = backend_config["neuron"]["lnc"]
    cache_root = Path(cache_root).resolve()
    device_backend = make_backend(backend_config, str(cache_root))
    # This process uses the device itself, not through torchrun's ranks: it needs what they get from the
    # launcher (on neuron the compile caches under the project and the LNC) before the kernels load the runtime.
    apply_device_process_env(device_backend)
    installed = backend_module(backend).install_kernels(lnc)
    # config kernel_numerics, complete from the schema's defaults (config/trn2.yaml sets the neuron values),
    # on the backend's device with the kernels installed for it.
    device = device_backend.device_type
    cache_dir = str(cache_root / "torchinductor")
    config = {**settings, "lnc": lnc, "device": device, "compile": {**settings["compile"], "cache_dir": cache_dir}}
    result = kernel_numerics(config, log=log)
    write_json(Path(results_path), result)  # everything measured, kept for a failed run too
    record_measured(problems=result["problems"], numerics=[
        {"section": section, **row} for section in ("rope", "moe") for row in result[section]])
    if result["problems"]:
        raise NumericsError("kernel_numerics failed:\n  - " + "\n  - ".join(result["problems"]))
    largest = {section: _largest_per_dtype(result[section]) for section in ("rope", "moe")}
    summary = StageSummary(
        stage="kernel_numerics",
        status="pass",
        backend=backend,
        figures={
            "numerics": [{"section": section, **row} for section in ("rope", "moe") for row in result[section]],
            "largest_diff_per_dtype": largest,
            "seq_len_rule": result["seq_len_rule"],
            "replacement_counts": result["replacement_counts"],
            "replaced_model_trains": result["trains"],
            "compile": result["compile"],
            "device": result["device"],
            "implementations": installed,
        },
        proves=(
            f"On the {result['device']} device, the RoPE replacement (the op qwen3_pilot::rope_hf in HF layout "
            "(batch, heads, seq, head_dim) with its own autograd, behind a wrapper that converts torchtitan's "
            f"layout; implementation: {installed['rope_hf']}) matches torchtitan's RoPE in forward and q/k "
            f"gradients, and the grouped-matmul experts ({installed['moe_grouped_experts']}) match a per-expert "
            "loop, in float32 and bfloat16 over the shapes listed, within the tolerances listed; the replacement "
            "converters replaced exactly one module per layer; a model built with them trains to the same "
            "losses as without them"
            + ("; torch.compile gives the eager result" if result["compile"]["models"] else "")
            + f"; a seq len that breaks the kernel's multiple-of-128 x LNC={lnc} rule is refused with a clear error."
        ),
        does_not_prove=(
            ("Anything about the NKI kernels themselves: on this backend the replacement runs a PyTorch "
             "implementation of the same HF-layout contract. " if backend == "cpu" else
             "That the kernels are faster (the benchmark stage measures that), or anything about torch.compile "
             "with the neuron backend (not checked here). ")
            + "A difference within tolerance holds for these shapes and dtypes only; other shapes, dtypes or "
            "sequence lengths were not tested."
        ),
    )
    summary.add_artifacts([Path(results_path)])
    return summary.write(Path(summary_path))
