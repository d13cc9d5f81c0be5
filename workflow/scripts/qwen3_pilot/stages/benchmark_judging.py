"""Rule judge for the benchmark: each steady phase flagged noisy above benchmark.noisy_cv, the eager runs priced
at benchmark.price and the full run of benchmark.budget projected. Apart from what the stage measures with
(stages/benchmark.py, benchmark_runs.py), which never imports it: a price, budget or wording edit here
re-judges and runs no benchmark (parse_time/code.py)."""

from __future__ import annotations

from typing import Any

from ..benchmark_runs import BenchmarkError


def judge_benchmark(stage: str, figures: dict[str, Any], judging: dict[str, Any], backend: str) -> dict[str, Any]:
    """The benchmark's measured runs judged (rule judge): each steady phase flagged noisy above
    benchmark.noisy_cv, the eager runs priced at benchmark.price.per_hour where one is set and the full run of
    benchmark.budget projected. Fills `figures`; returns proves, does_not_prove and the notes of the noisy runs."""
    noisy_cv = judging["noisy_cv"]
    for row in figures["table"]:
        row["noisy"] = row["cv"] > noisy_cv
    figures["noisy_cv"] = noisy_cv
    price, budget = judging["price"], judging["budget"]
    eager = [row for row in figures["table"] if row["run"] == "eager"]
    figures["price"] = price if price["per_hour"] is not None else NO_PRICE
    figures["cost"] = [
        {"recipe": row["recipe"], **cost(price["per_hour"], row["tokens_per_s_per_instance"], row["warmup_phase_s"])}
        for row in eager
    ] if price["per_hour"] is not None else NO_PRICE
    figures["projection"] = projected(figures, eager, price, budget, backend)
    warmup, measured, ranks = figures["warmup_steps"], figures["measured_steps"], figures["ranks"]
    return {
        "notes": [f"NOISY: {row['recipe']} ({row['run']}): steady step time varies by {row['cv']:.0%} (coefficient "
                  f"of variation above benchmark.noisy_cv = {noisy_cv})" for row in figures["table"] if row["noisy"]],
        "proves": (
            f"What a step of each recipe cost on this machine's {ranks} {backend} ranks in "
            f"this run: time to the end of step 1 (startup and compilation included), each of {warmup} warm-up "
            f"steps, and over {measured} steady steps the median, p10, p90 and spread of the step time, tokens/s, "
            "TFLOPS and MFU against the peak named here, peak memory per rank and the share of time spent waiting "
            f"for data; compiled ({figures['compile_backend']}) against eager with an empty and a warm compile "
            "cache; replaced kernels against plain. The compile cost at step 1 (compiled cold - eager) compares "
            + ("two cold runs: the eager run compiles too and starts from an empty compile cache of its own."
               if figures["eager_compiles"] else "the cold compiled run with an eager run, which compiles nothing.")
        ),
        "does_not_prove": (
            ("A CPU step time predicts nothing about a trn2, and MFU here is against a measured CPU matmul peak. "
             if backend == "cpu" else "")
            + "The reduced MoE is not Qwen3-30B-A3B. The runs start from random init, so the figures say nothing "
            "about loss. One run per variant: a figure that moves by less than its run's spread (p10 to p90) "
            "between two reports is noise, not a change."
        ),
    }


NO_PRICE = ("not priced: set benchmark.price.per_hour with its kind, region, as_of and source (no price is "
            "built in)")


def projected(figures: dict[str, Any], eager: list[dict[str, Any]], price: dict[str, Any], budget: dict[str, Any],
              backend: str) -> dict[str, Any] | str:
    """The full run benchmark.budget describes, per benchmarked recipe and scaling efficiency, with the basis
    every figure rests on; a sentence naming what to set when there is no budget."""
    if budget["tokens"] is None:
        return ("not projected: set benchmark.budget.tokens (the full run's tokens; benchmark.budget.instances and "
                "benchmark.price.per_hour for its cost)")
    basis = (f"A linear projection from a pilot of {figures['measured_steps']} steady steps of each recipe on "
             f"{figures['ranks']} {backend} ranks of one instance (eager, random init): {budget['tokens']:,.0f} "
             f"tokens on {budget['instances']} instance(s), each paying the measured warm-up once, at each scaling "
             "efficiency shown (assumed, not measured: the pilot runs one instance)"
             + ("; no cost: benchmark.price.per_hour is not set." if price["per_hour"] is None else
                f"; cost at {price['per_hour']:g} {price['currency']} per instance-hour ({price['kind']}, "
                f"{price['region']}, as of {price['as_of']}; {price['source']})."))
    rows = [{"recipe": row["recipe"], **projection(budget["tokens"], budget["instances"], efficiency,
                                                   row["tokens_per_s_per_instance"], row["warmup_phase_s"],
                                                   price["per_hour"])}
            for row in eager for efficiency in budget["scaling_efficiencies"]]
    return {"basis": basis, "rows": rows}


def cost(price_per_hour: float, tokens_per_s_per_instance: float, warmup_s: float) -> dict[str, float]:
    """At a price per instance-hour: the cost of a million tokens at steady state, and of the warm-up
    (startup, compilation and warm-up steps) that every run pays once."""
    if not tokens_per_s_per_instance > 0:
        raise BenchmarkError(f"tokens/s per instance = {tokens_per_s_per_instance}: no cost per token")
    return {
        "price_per_hour": price_per_hour,
        "per_million_tokens": price_per_hour / 3600 / tokens_per_s_per_instance * 1e6,
        "tokens_per_unit_price": tokens_per_s_per_instance * 3600 / price_per_hour,
        "warmup": price_per_hour * warmup_s / 3600,
    }


def projection(tokens: float, instances: int, efficiency: float, tokens_per_s_per_instance: float, warmup_s: float,
               price_per_hour: float | None) -> dict[str, Any]:
    """The full run, linearly: `tokens` at the measured steady rate per instance times `instances` times
    `efficiency`, after one warm-up (startup, compilation, warm-up steps) on every instance; its cost at the
    price per instance-hour where one is given (None: no cost)."""
    if not tokens_per_s_per_instance > 0:
        raise BenchmarkError(f"tokens/s per instance = {tokens_per_s_per_instance}: nothing to project from")
    wall_s = warmup_s + tokens / (tokens_per_s_per_instance * instances * efficiency)
    return {"scaling_efficiency": efficiency, "wall_time_h": wall_s / 3600, "wall_time_days": wall_s / 86400,
            "instance_hours": instances * wall_s / 3600,
            "cost": None if price_per_hour is None else instances * wall_s / 3600 * price_per_hour}
