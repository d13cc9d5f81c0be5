"""The module replacement registry on torchtitan's real Qwen3 modules: what it replaces, and each way a
rule is refused (no match, a match outside the target, a wrong type, a count that is not one per layer)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from qwen3_pilot import numerics  # noqa: E402
from qwen3_pilot.kernels.moe import KernelGroupedExperts, grouped_experts_replacement_rule  # noqa: E402
from qwen3_pilot.kernels.rope import HFLayoutRoPE, rope_replacement_rule  # noqa: E402
from qwen3_pilot.replacement import ReplacementError, ReplacementRule, apply_rules, matching_modules  # noqa: E402

SEQ_LEN = 256
DENSE = numerics.DEFAULTS["train"]["dense"]
MOE = numerics.DEFAULTS["train"]["moe"]


@pytest.fixture
def dense_model():
    return numerics.build_tiny_model(DENSE, SEQ_LEN, moe=False, seed=0)


@pytest.fixture
def moe_model():
    return numerics.build_tiny_model(MOE, SEQ_LEN, moe=True, seed=0)


def identity_rule(pattern: str, expected: int | None = None, **fields) -> ReplacementRule:
    return ReplacementRule(
        name="probe", pattern=pattern, replacement_factory=lambda module: module,
        expected_count=(lambda model: expected) if expected is not None else None, **fields,
    )


def module_types(model, pattern: str) -> set[str]:
    return {type(module).__name__ for _, module in matching_modules(model, pattern)}


def test_rope_rule_replaces_one_rope_per_layer_and_keeps_outputs(dense_model):
    tokens = torch.randint(0, DENSE["vocab"], (1, SEQ_LEN))
    before = dense_model(tokens)
    lines: list[str] = []

    counts = apply_rules(dense_model, [rope_replacement_rule(lnc=2)], log=lines.append)

    assert counts == {"rope_hf": DENSE["layers"]}
    assert module_types(dense_model, "layers.*.attention.rope") == {"HFLayoutRoPE"}
    assert lines == [f"rope_hf: layers.{i}.attention.rope CosSinRoPE -> HFLayoutRoPE" for i in range(DENSE["layers"])]
    assert torch.equal(dense_model(tokens), before)


def test_moe_rule_replaces_experts_and_keeps_the_state_dict(moe_model):
    keys_before = set(moe_model.state_dict())
    counts = apply_rules(moe_model, [rope_replacement_rule(), grouped_experts_replacement_rule()], log=lambda line: None)

    assert counts == {"rope_hf": MOE["layers"], "moe_grouped_experts": MOE["layers"]}
    experts = moe_model.get_submodule("layers.0.moe.routed_experts.inner_experts")
    assert isinstance(experts, KernelGroupedExperts)
    assert set(moe_model.state_dict()) == keys_before


def test_zero_matches_raise(dense_model):
    with pytest.raises(ReplacementError, match="matched no module"):
        apply_rules(dense_model, [identity_rule("layers.*.attention.rotary_emb", expected=DENSE["layers"])])


def test_moe_rule_on_a_dense_model_raises(dense_model):
    with pytest.raises(ReplacementError, match="moe_grouped_experts: pattern .* matched no module"):
        apply_rules(dense_model, [grouped_experts_replacement_rule()])


def test_match_outside_the_scope_raises(dense_model):
    # "*norm" also catches the final norm, which is not in any layer.
    with pytest.raises(ReplacementError, match=r"outside the scope 'layers\.\*'.*: norm$"):
        apply_rules(dense_model, [identity_rule("*norm", expected=1)])


def test_more_matches_than_expected_raise(dense_model):
    # q_norm and k_norm: two per layer where one per layer is expected.
    with pytest.raises(ReplacementError, match=f"matched {2 * DENSE['layers']} module\\(s\\), expected {DENSE['layers']}"):
        apply_rules(dense_model, [identity_rule("layers.*.attention.?_norm", expected=DENSE["layers"])])


def test_wrong_module_type_raises(dense_model):
    from torchtitan.models.common.moe import GroupedExperts

    with pytest.raises(ReplacementError, match="not GroupedExperts.*CosSinRoPE"):
        rule = identity_rule("layers.*.attention.rope", expected=DENSE["layers"], required_type=GroupedExperts)
        apply_rules(dense_model, [rule])


def test_expected_count_override_is_checked(dense_model):
    with pytest.raises(ReplacementError, match=f"matched {DENSE['layers']} module\\(s\\), expected 1"):
        apply_rules(dense_model, [rope_replacement_rule()], expected_counts={"rope_hf": 1})


def test_rule_without_expected_count_raises(dense_model):
    with pytest.raises(ReplacementError, match="no expected count"):
        apply_rules(dense_model, [identity_rule("layers.*.attention.rope")])


def test_overlapping_rules_raise(dense_model):
    attention = identity_rule("layers.*.attention", expected=DENSE["layers"])
    with pytest.raises(ReplacementError, match="both reach"):
        apply_rules(dense_model, [attention, rope_replacement_rule()])


def test_a_refused_rule_leaves_the_model_untouched(dense_model):
    with pytest.raises(ReplacementError):
        apply_rules(dense_model, [rope_replacement_rule(), identity_rule("layers.*.missing", expected=1)])
    assert module_types(dense_model, "layers.*.attention.rope") == {"CosSinRoPE"}


def test_replaced_rope_cache_is_rebuilt_by_torchtitan_init_states(dense_model):
    apply_rules(dense_model, [rope_replacement_rule()], log=lambda line: None)
    rope = dense_model.get_submodule("layers.0.attention.rope")
    assert isinstance(rope, HFLayoutRoPE)
    expected = rope.source.cache.clone()
    rope.source.cache.zero_()
    dense_model.init_states()
    assert torch.equal(rope.source.cache, expected)
