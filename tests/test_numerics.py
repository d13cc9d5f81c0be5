"""The kernel numerics checks pass for the real implementations and fail for wrong ones: a RoPE with the
rotation's sign flipped or its halves swapped, grouped experts with permuted expert weights, a sequence
length off the NKI kernel's 128 x LNC grid, and a model trained through a wrong RoPE."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import default_config

from qwen3_pilot import numerics
from qwen3_pilot.config import deep_update
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


def sign_flipped_rope(q, k, cos, sin, lnc=None):
    """rotate_half with the sign on the wrong half: a rotation by -angle."""

    def wrong(x):
        x1, x2 = x.float().chunk(2, dim=-1)
        rotated = torch.cat((x2, -x1), dim=-1)
        return (x.float() * cos[:, None] + rotated * sin[:, None]).type_as(x)

    return wrong(q), wrong(k)


def swapped_halves_rope(q, k, cos, sin, lnc=None):
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


def failed(rows):
    return [row for row in rows if row["verdict"] != "pass"]


# ---- each comparison at its tolerance: a difference just within passes, just beyond fails ----

TOLERANCE = 2.0**-10
# Exact in float32, where max_abs_diff measures: a difference of the tolerance plus or minus 2^-8 of it.
WITHIN, BEYOND = TOLERANCE - 2.0**-18, TOLERANCE + 2.0**-18


@pytest.mark.parametrize("difference, verdict", [(WITHIN, "pass"), (TOLERANCE, "pass"), (BEYOND, "fail")])
def test_a_comparison_row_holds_the_largest_difference_to_its_tolerance(difference, verdict):
    row = numerics.comparison_row("rope_forward_q", "float32", [2], torch.tensor([0.5, 1.0 + difference]),
                                  torch.tensor([0.5, 1.0]), TOLERANCE)
    assert (row["max_abs_diff"], row["verdict"]) == (difference, verdict)
    assert len(numerics.row_problems("rope", [row])) == (verdict == "fail")


@pytest.mark.parametrize("difference, verdict", [(1e-4 * (1 - 1e-3), "pass"), (1e-4 * (1 + 1e-3), "fail")])
def test_a_tiny_models_losses_are_held_to_tiny_model_loss_tolerance(difference, verdict):
    run = numerics._loss_comparison([5.0, 4.9], [5.0, 4.9 + difference], tolerance=1e-4)
    assert run["verdict"] == verdict
    assert len(numerics.train_problems({"dense": run})) == (verdict == "fail")


@pytest.mark.parametrize("logits_difference, grad_difference, verdict", [
    (WITHIN, WITHIN, "pass"), (BEYOND, WITHIN, "fail"), (WITHIN, BEYOND, "fail"),
])
def test_compiled_against_eager_holds_logits_and_gradients_to_the_compile_tolerance(
    monkeypatch, logits_difference, grad_difference, verdict
):
    """The two runs' logits and gradients handed in (eager first): only the comparison is under test."""
    runs = iter([(torch.zeros(2), {"w": torch.zeros(2)}),
                 (torch.tensor([0.0, logits_difference]), {"w": torch.tensor([grad_difference, 0.0])})])
    monkeypatch.setattr(numerics, "_logits_and_grads", lambda model, inputs: next(runs))
    result = numerics.compiled_matches_eager(torch.nn.Linear(2, 2), None, "eager", TOLERANCE)
    assert (result["logits_max_abs_diff"], result["grad_max_abs_diff"]) == (logits_difference, grad_difference)
    assert result["verdict"] == verdict
    assert len(numerics.compile_problems({"models": {"dense": result}})) == (verdict == "fail")


# ---- RoPE ----


def test_rope_op_matches_torchtitan_rope():
    rows = numerics.rope_numerics(ROPE_SHAPES, DTYPES, ROPE_TOLERANCES)
    assert len(rows) == len(ROPE_SHAPES) * len(DTYPES) * 4
    assert failed(rows) == []
    assert {row["op"] for row in rows} == {"rope_forward_q", "rope_forward_k", "rope_grad_q", "rope_grad_k"}
    assert [2, 256, 2, 64] in [row["shape"] for row in rows]  # the GQA key
    assert numerics.row_problems("rope", rows) == []


@pytest.mark.parametrize("wrong_rope", [sign_flipped_rope, swapped_halves_rope])
def test_wrong_rope_is_reported(wrong_rope):
    rows = numerics.rope_numerics(ROPE_SHAPES[:1], DTYPES, ROPE_TOLERANCES, rope_apply=wrong_rope)
    assert {(row["op"], row["dtype"]) for row in failed(rows)} == {
        (op, dtype) for op in ("rope_forward_q", "rope_forward_k", "rope_grad_q", "rope_grad_k") for dtype in DTYPES
    }
    problems = numerics.row_problems("rope", rows)
    assert len(problems) == len(rows) and "rope_forward_q float32" in problems[0]


def bf16_stepwise_rope(q, k, cos, sin, lnc=None):
    """The NKI rope_hf kernel's arithmetic: cos/sin loaded in q's dtype, q * cos and rotate_half(q) * sin
    each rounded to it, then their sum (bfloat16 tensors round every op; autograd's backward does the same)."""

    def rotate(x):
        cos_x, sin_x = cos.to(x.dtype)[:, None], sin.to(x.dtype)[:, None]
        return x * cos_x + rope_kernel.rotate_half(x) * sin_x

    return rotate(q), rotate(k)


def test_the_bf16_stepwise_bound_admits_a_kernel_that_rounds_every_step_and_not_a_wrong_rope():
    stepwise = {"bfloat16": "bf16_stepwise"}
    rows = numerics.rope_numerics(ROPE_SHAPES, ["bfloat16"], stepwise, rope_apply=bf16_stepwise_rope)
    assert len(rows) == len(ROPE_SHAPES) * 4 and failed(rows) == []
    # Rounding at every step differs from rounding once: the bound, not an exact match, is what passes.
    assert max(row["max_abs_diff"] for row in rows) > 0
    assert all(0 < row["tolerance"] < 0.5 for row in rows)  # derived from the inputs, not the string
    wrong = numerics.rope_numerics(ROPE_SHAPES[:1], ["bfloat16"], stepwise, rope_apply=sign_flipped_rope)
    assert len(failed(wrong)) == len(wrong) == 4


def test_rope_op_passes_torch_opcheck():
    """Schema, fake (meta) kernel and autograd registration, as torch.compile relies on them."""
    q, k = torch.randn(1, 2, 256, 16), torch.randn(1, 1, 256, 16)
    cos, sin = torch.randn(256, 16), torch.randn(256, 16)
    for requires_grad in (False, True):
        args = (q.clone().requires_grad_(requires_grad), k.clone().requires_grad_(requires_grad), cos, sin, False)
        torch.library.opcheck(torch.ops.qwen3_pilot.rope_hf.default, args)


def test_rope_backward_mode_is_the_transpose_of_forward():
    """<forward(x), g> == <x, backward(g)> for the linear map the kernel applies."""
    x, g = torch.randn(1, 2, 256, 16), torch.randn(1, 2, 256, 16)
    angles = torch.rand(256, 8) * 6.3
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    forward, _ = rope_kernel.rope_hf(x, x, cos, sin, False)
    backward, _ = rope_kernel.rope_hf(g, g, cos, sin, True)
    assert torch.allclose((forward * g).sum(), (x * backward).sum(), rtol=1e-5)


# ---- the NKI sequence-length rule ----


def test_seq_len_rule_check_shows_the_error_firing():
    check = numerics.seq_len_rule_check(lnc=2)
    assert check["verdict"] == "pass" and numerics.seq_len_rule_problems(check) == []
    assert check["good"] == {"seq_len": 256, "raised": False, "error": None}
    assert check["bad"]["seq_len"] == 384 and check["bad"]["raised"]
    assert "seq_len=384" in check["bad"]["error"] and "128 x LNC = 128 x 2 = 256" in check["bad"]["error"]


def test_seq_len_rule_raises_with_a_clear_message_in_the_model_path():
    rope = rope_kernel.HFLayoutRoPE(rope_kernel.HFLayoutRoPE.Config(dim=16, max_seq_len=512, lnc=2))
    x = torch.randn(1, 128, 2, 16)
    with pytest.raises(ValueError, match=r"seq_len=128 is not a multiple of 128 x LNC = 128 x 2 = 256"):
        rope(x, x)
    rope.lnc = 1
    rope(x, x)
    rope.lnc = None  # plain cpu: no kernel rule
    rope(x[:, :100], x[:, :100])


def test_seq_len_rule_problem_when_the_check_does_not_fire():
    check = numerics.seq_len_rule_check(lnc=1, bad_seq_len=256)  # 256 is a multiple of 128: no error
    assert check["verdict"] == "fail"
    assert "did not raise" in numerics.seq_len_rule_problems(check)[0]


# ---- MoE experts ----


def test_grouped_experts_match_the_per_expert_loop():
    rows = numerics.moe_numerics(MOE_SHAPES, DTYPES, MOE_TOLERANCES)
    assert failed(rows) == []
    impls = {(row["impl"], row["dtype"]) for row in rows}
    assert impls == {("grouped_experts_swiglu", "float32"), ("grouped_experts_swiglu", "bfloat16"),
                     ("torchtitan.GroupedExperts", "bfloat16")}
    assert len(rows) == len(impls) * 5


def test_permuted_expert_weights_are_reported():
    rows = numerics.moe_numerics(
        MOE_SHAPES, DTYPES, MOE_TOLERANCES, grouped_impl=permuted_experts, include_torchtitan=False
    )
    assert {(row["op"], row["dtype"]) for row in failed(rows)} == {
        (op, dtype) for op in numerics.MOE_OPS for dtype in DTYPES
    }
    assert "permuted_experts vs looped_experts_swiglu" in numerics.row_problems("moe", rows)[0]


# ---- tiny models and the whole stage ----

SMALL_TRAIN = {"steps": 2, "batch": 1}


def test_training_through_a_wrong_rope_is_reported():
    train = deep_update(NUMERICS, {"train": SMALL_TRAIN})["train"]
    train["moe"]["layers"] = 1
    trained = numerics.replaced_model_trains(train, lnc=2, log=lambda line: None, rope_apply=sign_flipped_rope)
    assert trained["trains"]["dense"]["verdict"] == "fail"
    assert numerics.train_problems(trained["trains"])[0].startswith("trains: dense: losses with replacements differ")


def test_kernel_numerics_on_a_small_config(tmp_path, capfd):
    config = deep_update(NUMERICS, {
        "rope": {"shapes": ROPE_SHAPES[1:]},
        "moe": {"shapes": MOE_SHAPES},
        "train": SMALL_TRAIN,
        "compile": {"backend": "aot_eager", "cache_dir": str(tmp_path / "inductor")},
    }) | {"lnc": 2, "device": "cpu"}
    lines: list[str] = []
    result = numerics.kernel_numerics(config, log=lines.append)

    assert result["problems"] == []
    assert set(result) == {"device", "implementations", "rope", "moe", "seq_len_rule", "replacement_counts", "trains",
                           "compile", "problems"}
    assert result["device"] == "cpu" and result["implementations"]["rope_hf"].startswith("PyTorch")
    layers = NUMERICS["train"]["dense"]["layers"]
    assert result["replacement_counts"] == {
        "dense": {"rope_hf": layers}, "moe": {"rope_hf": layers, "moe_grouped_experts": layers},
    }
    for run in result["trains"].values():
        assert len(run["losses_reference"]) == SMALL_TRAIN["steps"] and run["verdict"] == "pass"
    assert result["compile"]["backend"] == "aot_eager"
    assert result["compile"]["models"]["dense"]["verdict"] == "pass"
    # One launch-log line per replaced module as the replaced models are built, in the training stages' format.
    logged = [(line["kernel"], line["path"]) for line in parse_replacement_lines(capfd.readouterr().out)]
    assert logged.count(("rope_hf", "layers.0.attention.rope")) == 2  # the dense and the MoE model
    assert ("moe_grouped_experts", "layers.0.moe.routed_experts.inner_experts") in logged
    json.dumps(result)


def test_an_unknown_setting_is_refused_by_the_schema_with_its_key():
    from snakemake.exceptions import WorkflowError

    with pytest.raises(WorkflowError, match=r"'tolerance' was unexpected"):
        default_config({"kernel_numerics": {"rope": {"tolerance": 1e-3}}})
