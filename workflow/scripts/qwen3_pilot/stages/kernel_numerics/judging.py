"""The judge's half of kernel_numerics (rule judge): the measured differences held to the tolerances of config
`kernel_numerics` (rope.tolerances, moe.tolerances, train.tiny_model_loss_tolerance, compile.tolerances, the
judge's params), each row given its tolerance and verdict. A tolerance edit re-judges the recorded figures
without measuring again (on a trn2, the kernels' compile)."""

from __future__ import annotations

from typing import Any

from ...problems import problem_list
from .comparison import largest_per_dtype
from .rope_checks import bf16_stepwise_rope_bound


class NumericsError(RuntimeError):
    pass


def row_tolerance(row: dict[str, Any], tolerances: dict[str, Any]) -> tuple[str, float]:
    """(the figure the row is held to, its bound) for the row's dtype: max_abs_diff against an absolute
    tolerance, or against "bf16_stepwise" derived from the largest input the row measured; max_ulp_diff
    against {ulps: n}, a bound in units in the last place of the reference."""
    tolerance = tolerances[row["dtype"]]
    if tolerance == "bf16_stepwise":
        return "max_abs_diff", bf16_stepwise_rope_bound(row["max_abs_input"])
    if isinstance(tolerance, dict):
        return "max_ulp_diff", tolerance["ulps"]
    return "max_abs_diff", tolerance


def within(difference: float, tolerance: float) -> str:
    return "pass" if difference <= tolerance else "fail"  # NaN compares false: a NaN difference fails


def judged_rows(rows: list[dict[str, Any]], tolerances: dict[str, dict[str, Any]]) -> list[str]:
    """Each comparison row (its "section" rope or moe) given its tolerance and verdict; the failed ones in words."""
    problems = []
    for row in rows:
        row["held_to"], row["tolerance"] = row_tolerance(row, tolerances[row["section"]])
        row["verdict"] = within(row[row["held_to"]], row["tolerance"])
        if row["verdict"] != "pass":
            measured = (f"max abs diff {row['max_abs_diff']:.3g} > tolerance {row['tolerance']:.3g}"
                        if row["held_to"] == "max_abs_diff" else
                        f"max diff {row['max_ulp_diff']:.3g} ulps > tolerance {row['tolerance']:g} ulps "
                        f"(max abs diff {row['max_abs_diff']:.3g})")
            problems.append(
                f"{row['section']}: {row['op']} {row['dtype']} shape {row['shape']}"
                + (f" ({row['impl']} vs {row['reference']})" if "impl" in row else "") + f": {measured}")
    return problems


def float32_agreement(ulps: float | None) -> str:
    """What the largest float32 difference in ulps proves, said with the verdict."""
    if ulps is None:
        return ""
    if ulps == 0:
        return (" In float32 every output and gradient is bit-identical to PyTorch's (0 ulps) for these inputs: the "
                "same rounding at every step, or differences that cancel exactly.")
    return (f" In float32 the largest difference is {ulps:.3g} ulps of PyTorch's value: agreement up to the last "
            "bits, what another order of the same exact operations or a fused multiply-add gives; not bit "
            "identity, and no bound at inputs not tested.")


def judged_trains(trains: dict[str, Any], tolerance: float) -> list[str]:
    """Each tiny model's replaced losses against torchtitan's, held to tiny_model_loss_tolerance (and finite)."""
    problems = []
    for kind, run in trains.items():
        run["tolerance"] = tolerance
        run["verdict"] = within(run["max_abs_loss_diff"], tolerance) if run["finite"] else "fail"
        if run["verdict"] != "pass":
            problems.append(
                f"trains: {kind}: losses with replacements differ from torchtitan's by up to "
                f"{run['max_abs_loss_diff']:.3g} > tolerance {tolerance:.3g} "
                f"({run['losses_reference']} vs {run['losses_replaced']})")
    return problems


def judged_compile(compiled: dict[str, Any], tolerances: dict[str, float]) -> list[str]:
    """Each compiled model's logits and gradients against eager, held to its kind's compile tolerance."""
    problems = []
    for kind, result in compiled["models"].items():
        tolerance = result["tolerance"] = tolerances[kind]
        verdicts = {within(result[figure], tolerance) for figure in ("logits_max_abs_diff", "grad_max_abs_diff")}
        result["verdict"] = "pass" if verdicts == {"pass"} else "fail"
        if result["verdict"] != "pass":
            problems.append(
                f"compile: {kind} ({result['backend']}): compiled vs eager logits differ by "
                f"{result['logits_max_abs_diff']:.3g}, gradients by {result['grad_max_abs_diff']:.3g} "
                f"(tolerance {tolerance:.3g})")
    return problems


def judged_problems(figures: dict[str, Any], judging: dict[str, Any]) -> list[str]:
    """The measured figures given their tolerances and verdicts in place; every check that failed, in words."""
    sections = {row["section"] for row in figures["numerics"]}  # rope, moe, and any kernel's section added
    tolerances = {section: judging[section]["tolerances"] for section in sections}
    return (judged_rows(figures["numerics"], tolerances)
            + judged_trains(figures["replaced_model_trains"], judging["train"]["tiny_model_loss_tolerance"])
            + judged_compile(figures["compile"], judging["compile"]["tolerances"]))


def judge_kernel_numerics(stage: str, figures: dict[str, Any], judging: dict[str, Any],
                          backend: str) -> dict[str, str]:
    """Rule judge for kernel_numerics: fills in the tolerances and verdicts; returns proves and does_not_prove."""
    problems = judged_problems(figures, judging)  # in place: the failure record (judge.run) holds these figures
    if problems:
        raise NumericsError(problem_list("kernel_numerics failed", problems))
    installed, rule = figures["implementations"], figures["seq_len_rule"]
    float32_ulps = largest_per_dtype(figures["numerics"], "max_ulp_diff").get("float32")
    compile_backends = ", ".join(sorted({model["backend"] for model in figures["compile"]["models"].values()}))
    return {
        "proves": (
            f"On the {figures['device']} device, the RoPE replacement (the op qwen3_pilot::rope_hf in HF layout "
            "(batch, heads, seq, head_dim) with its own autograd, behind a wrapper that converts torchtitan's "
            f"layout; implementation: {installed['rope_hf']}) matches torchtitan's RoPE in forward and q/k "
            f"gradients, and the grouped-matmul experts ({installed['moe_grouped_experts']}) match a per-expert "
            "loop, in float32 and bfloat16 over the shapes listed, within the tolerances listed; the replacement "
            "converters replaced exactly one module per layer; a model built with them trains to the same "
            "losses as without them"
            + (f"; torch.compile ({compile_backends}) gives the eager result" if compile_backends else "")
            + (f"; a seq len that breaks the kernel's rule (a multiple of {rule['required_multiple']}: {rule['rule']}) "
               "is refused with a clear error." if rule["applies"] else ".")
            + float32_agreement(float32_ulps)
        ),
        "does_not_prove": (
            ("Anything about the NKI kernels themselves: on this backend the replacement runs a PyTorch "
             "implementation of the same HF-layout contract. " if backend == "cpu" else
             "That the kernels are faster (the benchmark stage measures that), or anything about torch.compile "
             "with the neuron backend (not checked here). ")
            + "A difference within tolerance holds for these shapes and dtypes only; other shapes, dtypes or "
            "sequence lengths were not tested."
        ),
    }
