"""The kernel numerics checks (stages/kernel_numerics/) pass for the real implementations and fail for wrong
ones: a RoPE with the rotation's sign flipped or its halves swapped, grouped experts with permuted expert
weights, a sequence length off the NKI kernel's 128 x LNC grid, and a model trained through a wrong RoPE. The
stage measures; the judge (judging.py) holds each figure to its tolerance."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import default_config

from qwen3_pilot.backends import cpu as cpu_backend
from qwen3_pilot.backends.neuron.kernel_limits import check_seq_len, kernel_limits
from qwen3_pilot.parse_time.config import deep_update, stage_judging, stage_measuring
from qwen3_pilot.stages import kernel_numerics
from qwen3_pilot.stages.kernel_numerics import compile_checks, judging, tiny_models
from qwen3_pilot.stages.kernel_numerics.comparison import comparison_row
from qwen3_pilot.stages.kernel_numerics.experts_checks import MOE_OPS, moe_numerics
from qwen3_pilot.stages.kernel_numerics.rope_checks import rope_numerics, seq_len_rule_check, seq_len_rule_problems
from qwen3_pilot.titan.kernels import parse_replacement_lines
from qwen3_pilot.titan.kernels import rope as rope_kernel
from qwen3_pilot.titan.kernels.moe import grouped_experts_swiglu

ROPE_SHAPES = [
    {"batch": 1, "seq": 256, "heads": 4, "kv_heads": 4, "head_dim": 32},
    {"batch": 2, "seq": 256, "heads": 4, "kv_heads": 2, "head_dim": 64},  # grouped-query
]
MOE_SHAPES = [{"tokens": 64, "dim": 32, "hidden": 16, "experts": 4}]
DTYPES = ["float32", "bfloat16"]
NUMERICS = default_config()["kernel_numerics"]  # the schema's defaults
ROPE_TOLERANCES = NUMERICS["rope"]["tolerances"]
MOE_TOLERANCES = NUMERICS["moe"]["tolerances"]


def sign_flipped_rope(q, k, cos, sin):
    """rotate_half with the sign on the wrong half: a rotation by -angle."""

    def wrong(x):
        x1, x2 = x.float().chunk(2, dim=-1)
        rotated = torch.cat((x2, -x1), dim=-1)
        return (x.float() * cos[:, None] + rotated * sin[:, None]).type_as(x)

    return wrong(q), wrong(k)


def swapped_halves_rope(q, k, cos, sin):
    """Pairs dimension i with i+1 (interleaved, ComplexRoPE's convention) instead of i + head_dim/2."""

    def wrong(x):
        pairs = x.float().unflatten(-1, (-1, 2))
        rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
        return (x.float() * cos[:, None] + rotated * sin[:, None]).type_as(x)

    return wrong(q), wrong(k)


def permuted_experts(x, counts, w1, w2, w3, compute_dtype=torch.bfloat16):
    """Every expert's tokens sent through the next expert's weights."""
    roll = lambda w: w.roll(1, dims=0)  # noqa: E731
    return grouped_experts_swiglu(x, counts, roll(w1), roll(w2), roll(w3), compute_dtype=compute_dtype)


def judged(section, rows, tolerances):
    """The measured rows as the judge holds them to `tolerances` (per dtype): the rows and the problems."""
    rows = [{"section": section, **row} for row in rows]
    return rows, judging.judged_rows(rows, {section: tolerances})


def failed(rows):
    return [row for row in rows if row["verdict"] != "pass"]


# ---- each comparison at its tolerance: a difference just within passes, just beyond fails ----

TOLERANCE = 2.0**-10
# Exact in float32, where max_abs_diff measures: a difference of the tolerance plus or minus 2^-8 of it.
WITHIN, BEYOND = TOLERANCE - 2.0**-18, TOLERANCE + 2.0**-18


@pytest.mark.parametrize("difference, verdict", [(WITHIN, "pass"), (TOLERANCE, "pass"), (BEYOND, "fail")])
def test_a_comparison_row_holds_the_largest_difference_to_its_tolerance(difference, verdict):
    row = comparison_row("rope_forward_q", "float32", [2], torch.tensor([0.5, 1.0 + difference]),
                         torch.tensor([0.5, 1.0]))
    assert row["max_abs_diff"] == difference and "verdict" not in row  # measured: no tolerance yet
    (row,), problems = judged("rope", [row], {"float32": TOLERANCE})
    assert (row["tolerance"], row["verdict"]) == (TOLERANCE, verdict)
    assert len(problems) == (verdict == "fail")


def test_a_nan_difference_fails_whatever_the_tolerance():
    (row,), problems = judged("moe", [{"op": "moe_forward", "dtype": "bfloat16", "shape": [2],
                                       "max_abs_diff": float("nan")}], {"bfloat16": 1e9})
    assert row["verdict"] == "fail" and "max abs diff nan" in problems[0]


@pytest.mark.parametrize("difference, verdict", [(1e-4 * (1 - 1e-3), "pass"), (1e-4 * (1 + 1e-3), "fail")])
def test_a_tiny_models_losses_are_held_to_tiny_model_loss_tolerance(difference, verdict):
    run = tiny_models.loss_comparison([5.0, 4.9], [5.0, 4.9 + difference])
    problems = judging.judged_trains({"dense": run}, tolerance=1e-4)
    assert run["verdict"] == verdict
    assert len(problems) == (verdict == "fail")


def test_a_tiny_model_with_a_non_finite_loss_fails_whatever_the_tolerance():
    run = tiny_models.loss_comparison([5.0, float("inf")], [5.0, float("inf")])
    assert judging.judged_trains({"moe": run}, tolerance=1e9) and run["verdict"] == "fail"


@pytest.mark.parametrize("logits_difference, grad_difference, verdict", [
    (WITHIN, WITHIN, "pass"), (BEYOND, WITHIN, "fail"), (WITHIN, BEYOND, "fail"),
])
def test_compiled_against_eager_holds_logits_and_gradients_to_the_compile_tolerance(
    monkeypatch, logits_difference, grad_difference, verdict
):
    """The two runs' logits and gradients handed in (eager first): only the comparison is under test."""
    runs = iter([(torch.zeros(2), {"w": torch.zeros(2)}),
                 (torch.tensor([0.0, logits_difference]), {"w": torch.tensor([grad_difference, 0.0])})])
    monkeypatch.setattr(compile_checks, "_logits_and_grads", lambda model, inputs: next(runs))
    result = compile_checks.compiled_against_eager(torch.nn.Linear(2, 2), None, "eager")
    assert (result["logits_max_abs_diff"], result["grad_max_abs_diff"]) == (logits_difference, grad_difference)
    problems = judging.judged_compile({"models": {"dense": result}}, {"dense": TOLERANCE})
    assert result["verdict"] == verdict
    assert len(problems) == (verdict == "fail")


# ---- RoPE ----


def test_rope_op_matches_torchtitan_rope():
    rows, problems = judged("rope", rope_numerics(ROPE_SHAPES, DTYPES), ROPE_TOLERANCES)
    assert len(rows) == len(ROPE_SHAPES) * len(DTYPES) * 4
    assert failed(rows) == [] and problems == []
    assert {row["op"] for row in rows} == {"rope_forward_q", "rope_forward_k", "rope_grad_q", "rope_grad_k"}
    assert [2, 256, 2, 64] in [row["shape"] for row in rows]  # the GQA key


@pytest.mark.parametrize("wrong_rope", [sign_flipped_rope, swapped_halves_rope])
def test_wrong_rope_is_reported(wrong_rope):
    rows, problems = judged("rope", rope_numerics(ROPE_SHAPES[:1], DTYPES, rope_apply=wrong_rope), ROPE_TOLERANCES)
    assert {(row["op"], row["dtype"]) for row in failed(rows)} == {
        (op, dtype) for op in ("rope_forward_q", "rope_forward_k", "rope_grad_q", "rope_grad_k") for dtype in DTYPES
    }
    assert len(problems) == len(rows) and "rope_forward_q float32" in problems[0]


def bf16_stepwise_rope(q, k, cos, sin):
    """The NKI rope_hf kernel's arithmetic: cos/sin loaded in q's dtype, q * cos and rotate_half(q) * sin
    each rounded to it, then their sum (bfloat16 tensors round every op; autograd's backward does the same)."""

    def rotate(x):
        cos_x, sin_x = cos.to(x.dtype)[:, None], sin.to(x.dtype)[:, None]
        return x * cos_x + rope_kernel.rotate_half(x) * sin_x

    return rotate(q), rotate(k)


def test_the_bf16_stepwise_bound_admits_a_kernel_that_rounds_every_step_and_not_a_wrong_rope():
    stepwise = {"bfloat16": "bf16_stepwise"}
    rows, _ = judged("rope", rope_numerics(ROPE_SHAPES, ["bfloat16"], rope_apply=bf16_stepwise_rope), stepwise)
    assert len(rows) == len(ROPE_SHAPES) * 4 and failed(rows) == []
    # Rounding at every step differs from rounding once: the bound, not an exact match, is what passes.
    assert max(row["max_abs_diff"] for row in rows) > 0
    assert all(0 < row["tolerance"] < 0.5 for row in rows)  # derived from the inputs, not the string
    wrong, _ = judged("rope", rope_numerics(ROPE_SHAPES[:1], ["bfloat16"], rope_apply=sign_flipped_rope), stepwise)
    assert len(failed(wrong)) == len(wrong) == 4


def test_rope_op_passes_torch_opcheck():
    """Schema, fake (meta) kernel and autograd registration, as torch.compile relies on them."""
    q, k = torch.randn(1, 2, 256, 16), torch.randn(1, 1, 256, 16)
    cos, sin = torch.randn(256, 16), torch.randn(256, 16)
    for requires_grad in (False, True):
        args = (q.clone().requires_grad_(requires_grad), k.clone().requires_grad_(requires_grad), cos, sin, False)
        torch.library.opcheck(torch.ops.qwen3_pilot.rope_hf.default, args)


def test_rope_backward_mode_is_the_transpose_of_forward():
    """<forward(x), g> == <x, backward(g)> for the linear map the kernel applies. The difference is held to the
    terms' magnitudes, not to the sum's: the sum of 8,192 products of random signs can land near zero (0.0534 in
    one run), where the float32 outputs' own rounding passed a relative 1e-5. Over 500 draws, rounding stayed
    below 3e-9 of the terms' sum, and a backward that is the forward mode again no closer than 1.3e-4."""
    x, g = torch.randn(1, 2, 256, 16), torch.randn(1, 2, 256, 16)
    angles = torch.rand(256, 8) * 6.3
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    forward, _ = rope_kernel.rope_hf(x, x, cos, sin, False)
    backward, _ = rope_kernel.rope_hf(g, g, cos, sin, True)
    products = forward.double() * g.double()
    difference = products.sum() - (x.double() * backward.double()).sum()
    assert abs(difference) <= 1e-6 * products.abs().sum()


# ---- a backend's sequence-length rule (the NKI kernel's, backends/neuron/kernel_limits.py) ----

NEURON_ROPE_RULE = kernel_limits({"neuron": {"lnc": 2}})["rope_hf"]


@pytest.fixture
def rule_enforcing_kernel():
    """The plain op behind the NKI kernel's own check, as backends/neuron/nki_rope.py runs it before each launch:
    what the RoPE module calls on a trn2, on this machine."""

    def checked(q, k, cos, sin, backward):
        check_seq_len(q.shape[2], 2)
        return rope_kernel.rope_hf(q, k, cos, sin, backward)

    rope_kernel.use_rope_op(checked)
    yield
    rope_kernel.use_rope_op(rope_kernel.rope_hf)


def test_seq_len_rule_check_shows_the_installed_kernels_rule_firing(rule_enforcing_kernel):
    check = seq_len_rule_check(NEURON_ROPE_RULE)
    assert check["verdict"] == "pass" and seq_len_rule_problems(check) == []
    assert check["good"] == {"seq_len": 256, "raised": False, "error": None}
    assert check["bad"]["seq_len"] == 384 and check["bad"]["raised"]
    assert "seq_len=384" in check["bad"]["error"] and "128 x LNC = 128 x 2 = 256" in check["bad"]["error"]


def test_the_rope_module_takes_any_length_unless_the_installed_kernel_has_a_rule(rule_enforcing_kernel):
    rope = rope_kernel.HFLayoutRoPE(rope_kernel.HFLayoutRoPE.Config(dim=16, max_seq_len=512))
    x = torch.randn(1, 128, 2, 16)
    with pytest.raises(ValueError, match=r"seq_len=128 is not a multiple of 128 x LNC = 128 x 2 = 256"):
        rope(x, x)
    rope_kernel.use_rope_op(rope_kernel.rope_hf)  # the cpu backend's: no rule
    rope(x[:, :100], x[:, :100])


def test_seq_len_rule_problem_when_the_installed_kernel_does_not_enforce_it():
    check = seq_len_rule_check(NEURON_ROPE_RULE)  # the plain op: no check before the "launch"
    assert check["verdict"] == "fail"
    assert seq_len_rule_problems(check) == [
        "seq_len_rule: seq_len=384 is not a multiple of 256 (the NKI rope_hf kernel tiles the sequence in blocks of "
        "128 rows per logical core (128 x LNC 2)) but did not raise"]


def test_the_rule_check_runs_the_kernel_on_the_backends_device():
    """On a trn2 the installed kernel takes device tensors: the module and its inputs go to the stage's device."""
    seen = []

    def kernel(q, k, cos, sin, backward):
        seen.append((q.device.type, cos.device.type))
        check_seq_len(q.shape[2], 2)
        return q, k

    rope_kernel.use_rope_op(kernel)
    try:
        check = seq_len_rule_check(NEURON_ROPE_RULE, device="meta")
    finally:
        rope_kernel.use_rope_op(rope_kernel.rope_hf)
    assert check["verdict"] == "pass" and seen == [("meta", "meta"), ("meta", "meta")]


def test_a_backend_without_a_kernel_rule_has_nothing_to_check():
    check = seq_len_rule_check(cpu_backend.kernel_limits(default_config()).get("rope_hf"))
    assert check == {"applies": False, "verdict": "pass"} and seq_len_rule_problems(check) == []


# ---- MoE experts ----


def test_grouped_experts_match_the_per_expert_loop():
    rows, _ = judged("moe", moe_numerics(MOE_SHAPES, DTYPES), MOE_TOLERANCES)
    assert failed(rows) == []
    impls = {(row["impl"], row["dtype"]) for row in rows}
    assert impls == {("grouped_experts_swiglu", "float32"), ("grouped_experts_swiglu", "bfloat16"),
                     ("torchtitan.GroupedExperts", "bfloat16")}
    assert len(rows) == len(impls) * 5


def test_permuted_expert_weights_are_reported():
    rows, problems = judged(
        "moe", moe_numerics(MOE_SHAPES, DTYPES, grouped_impl=permuted_experts, include_torchtitan=False),
        MOE_TOLERANCES)
    assert {(row["op"], row["dtype"]) for row in failed(rows)} == {(op, dtype) for op in MOE_OPS for dtype in DTYPES}
    assert "permuted_experts vs looped_experts_swiglu" in problems[0]


# ---- tiny models and the whole stage ----

SMALL_TRAIN = {"steps": 2, "batch": 1}


def test_training_through_a_wrong_rope_is_reported():
    train = deep_update(NUMERICS, {"train": SMALL_TRAIN})["train"]
    train["moe"]["layers"] = 1
    trained = tiny_models.replaced_model_trains(train, log=lambda line: None, rope_apply=sign_flipped_rope)
    problems = judging.judged_trains(trained["trains"], NUMERICS["train"]["tiny_model_loss_tolerance"])
    assert trained["trains"]["dense"]["verdict"] == "fail"
    assert problems[0].startswith("trains: dense: losses with replacements differ")


def test_kernel_numerics_measures_without_its_tolerances_and_the_judge_passes_it_on_a_small_config(tmp_path, capfd):
    """The stage's params hold no tolerance (config.stage_measuring), so a tolerance edit does not measure again;
    the judge's params (config.stage_judging) hold exactly those."""
    settings = deep_update(NUMERICS, {
        "rope": {"shapes": ROPE_SHAPES[1:]},
        "moe": {"shapes": MOE_SHAPES},
        "train": SMALL_TRAIN,
        "compile": {"backend": "aot_eager"},
    })
    measuring = stage_measuring({"kernel_numerics": settings}, "kernel_numerics")
    assert "tolerance" not in json.dumps(measuring)
    config = deep_update(measuring, {"compile": {"cache_dir": str(tmp_path / "inductor")}})
    config |= {"kernel_limits": cpu_backend.kernel_limits(default_config()), "device": "cpu"}
    lines: list[str] = []
    figures = kernel_numerics.measure(config, log=lines.append)

    assert set(figures) == {"numerics", "largest_diff_per_dtype", "seq_len_rule", "replacement_counts",
                            "replaced_model_trains", "compile", "device"}
    assert figures["device"] == "cpu" and "tolerance" not in json.dumps(figures)
    layers = NUMERICS["train"]["dense"]["layers"]
    assert figures["replacement_counts"] == {
        "dense": {"rope_hf": layers}, "moe": {"rope_hf": layers, "moe_grouped_experts": layers},
    }
    assert kernel_numerics.intrinsic_problems(figures, config["train"]) == []
    for run in figures["replaced_model_trains"].values():
        assert len(run["losses_reference"]) == SMALL_TRAIN["steps"]
    assert figures["compile"]["backend"] == "aot_eager"
    json.dumps(figures)

    tolerances = stage_judging({"kernel_numerics": settings}, "kernel_numerics")
    assert tolerances == {"rope": {"tolerances": ROPE_TOLERANCES}, "moe": {"tolerances": MOE_TOLERANCES},
                          "train": {"tiny_model_loss_tolerance": 1e-5},
                          "compile": {"tolerances": NUMERICS["compile"]["tolerances"]}}
    assert judging.judged_problems(figures, tolerances) == []
    assert {row["verdict"] for row in figures["numerics"]} == {"pass"}
    assert figures["compile"]["models"]["dense"]["verdict"] == "pass"
    # One launch-log line per replaced module as the replaced models are built, in the training stages' format.
    logged = [(line["kernel"], line["path"]) for line in parse_replacement_lines(capfd.readouterr().out)]
    assert logged.count(("rope_hf", "layers.0.attention.rope")) == 2  # the dense and the MoE model
    assert ("moe_grouped_experts", "layers.0.moe.routed_experts.inner_experts") in logged


def test_a_replacement_count_off_one_per_layer_fails_the_measurement_itself():
    """No tolerance decides it: the stage fails before the judge runs."""
    train = {"dense": {"layers": 2}, "moe": {"layers": 2}}
    figures = {"seq_len_rule": seq_len_rule_check(None),
               "replacement_counts": {"dense": {"rope_hf": 2}, "moe": {"rope_hf": 2, "moe_grouped_experts": 1}}}
    assert kernel_numerics.intrinsic_problems(figures, train) == [
        "replacement_counts: moe: rule moe_grouped_experts replaced 1 modules, model has 2 layers"]


def test_an_unknown_setting_is_refused_by_the_schema_with_its_key():
    from snakemake.exceptions import WorkflowError

    with pytest.raises(WorkflowError, match=r"'tolerance' was unexpected"):
        default_config({"kernel_numerics": {"rope": {"tolerance": 1e-3}}})


# ---- a float32 tolerance in ulps: what the guide's 0.0 becomes on a device with no bit-equality claim ----


def test_a_row_records_its_difference_in_ulps_of_the_reference():
    reference = torch.tensor([1.0, -3.0, 0.75])
    one_up = torch.nextafter(reference, torch.tensor(10.0))
    two_up = torch.nextafter(one_up, torch.tensor(10.0))
    assert comparison_row("rope_forward_q", "float32", [3], reference, reference)["max_ulp_diff"] == 0.0
    assert comparison_row("rope_forward_q", "float32", [3], one_up, reference)["max_ulp_diff"] == 1.0
    row = comparison_row("rope_forward_q", "float32", [3], two_up, reference)
    assert row["max_ulp_diff"] == 2.0 and row["max_abs_diff"] == pytest.approx(2 * 2.0**-22)  # at -3: 2^-22 apart
    # In bfloat16 an ulp at 1.0 is 2^-7.
    bf16 = torch.tensor([1.0], dtype=torch.bfloat16)
    assert comparison_row("rope_forward_q", "bfloat16", [1], bf16 + 2.0**-7, bf16)["max_ulp_diff"] == 1.0


@pytest.mark.parametrize("steps, verdict", [(0, "pass"), (2, "pass"), (3, "fail")])
def test_an_ulps_tolerance_holds_the_ulp_difference_not_the_absolute_one(steps, verdict):
    reference = torch.tensor([1.0, 1000.0])
    actual = reference.clone()
    for _ in range(steps):
        actual = torch.nextafter(actual, torch.tensor(1e9))
    row = comparison_row("rope_forward_q", "float32", [2], actual, reference)
    (row,), problems = judged("rope", [row], {"float32": {"ulps": 2}})
    assert (row["held_to"], row["tolerance"], row["verdict"]) == ("max_ulp_diff", 2, verdict)
    if verdict == "fail":
        assert problems == ["rope: rope_forward_q float32 shape [2]: max diff 3 ulps > tolerance 2 ulps "
                            f"(max abs diff {row['max_abs_diff']:.3g})"]


def test_the_verdict_says_what_its_float32_ulps_prove():
    assert "bit-identical to PyTorch's (0 ulps)" in judging.float32_agreement(0.0)
    two = judging.float32_agreement(2.0)
    assert "largest difference is 2 ulps" in two and "not bit identity" in two
    assert judging.float32_agreement(None) == ""
