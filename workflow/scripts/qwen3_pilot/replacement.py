"""Module replacement: swap named submodules of a built model for kernel-backed ones, and refuse to do it
silently wrong.

A `ReplacementRule` names the modules it replaces with an fnmatch pattern over the fully-qualified names
of `model.named_modules()` (as in `fnmatch`, `*` also crosses dots: "layers.*.attention.rope" matches
"layers.11.attention.rope"). `apply_rules` checks every rule before it touches the model, so a rule that
fails leaves the model as it was:

- a rule that matches no module is an error (a renamed torchtitan submodule would otherwise turn the
  kernel off without a word);
- every match must lie inside the rule's scope ("layers.*" by default) and be of the rule's required type
  (a pattern that also catches the final norm, or a ComplexRoPE where a CosSinRoPE was meant, is an error);
- the number of matches must equal the expected count, normally one per targeted transformer layer.

One log line per replaced module ("rope_hf: layers.3.attention.rope CosSinRoPE -> HFLayoutRoPE").
"""

from __future__ import annotations

import fnmatch
import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

_log = logging.getLogger(__name__)


class ReplacementError(ValueError):
    pass


@dataclass(frozen=True)
class ReplacementRule:
    """What to replace (`pattern`, optionally `required_type`), where it may be (`scope`), with what
    (`replacement_factory(original) -> new module`) and how many of them there must be
    (`expected_count(model)`, e.g. the number of transformer layers)."""

    name: str
    pattern: str
    replacement_factory: Callable[[Any], Any]
    expected_count: Callable[[Any], int] | None = None
    required_type: type | tuple[type, ...] | None = None
    scope: str = "layers.*"
    # What the rule is meant to hit, in words, for error messages and the report.
    target: str = ""


def matching_modules(model, pattern: str) -> list[tuple[str, Any]]:
    """(name, module) for every submodule whose fully-qualified name matches `pattern` (the root, whose
    name is empty, never matches)."""
    return [(name, module) for name, module in model.named_modules() if name and fnmatch.fnmatchcase(name, pattern)]


def apply_rules(
    model,
    rules: Iterable[ReplacementRule],
    expected_counts: Mapping[str, int] | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, int]:
    """Replaces every module each rule matches (setattr on its parent) and returns {rule name: count}.

    `expected_counts[rule.name]`, when given, overrides `rule.expected_count(model)`. Raises
    ReplacementError, before any module is replaced, when a rule breaks one of the checks above."""
    log = log or _log.info
    rules = list(rules)
    planned = {rule.name: _checked_matches(model, rule, _expected_count(model, rule, expected_counts)) for rule in rules}
    _check_no_overlap(planned)
    for rule in rules:
        for name, original in planned[rule.name]:
            replacement = rule.replacement_factory(original)
            _set_submodule(model, name, replacement)
            log(f"{rule.name}: {name} {type(original).__name__} -> {type(replacement).__name__}")
    return {rule.name: len(planned[rule.name]) for rule in rules}


def _expected_count(model, rule: ReplacementRule, expected_counts: Mapping[str, int] | None) -> int:
    if expected_counts is not None and rule.name in expected_counts:
        return expected_counts[rule.name]
    if rule.expected_count is None:
        raise ReplacementError(
            f"rule {rule.name}: no expected count (give the rule an expected_count function or pass "
            f"expected_counts[{rule.name!r}]); a replacement without one cannot tell a partial match"
        )
    return rule.expected_count(model)


def _checked_matches(model, rule: ReplacementRule, expected: int) -> list[tuple[str, Any]]:
    matches = matching_modules(model, rule.pattern)
    target = f" (target: {rule.target})" if rule.target else ""
    if not matches:
        raise ReplacementError(
            f"rule {rule.name}: pattern {rule.pattern!r} matched no module{target}; "
            f"modules that exist include {_sample_names(model, rule.scope)}"
        )
    outside = [name for name, _ in matches if not fnmatch.fnmatchcase(name, rule.scope)]
    if outside:
        raise ReplacementError(
            f"rule {rule.name}: pattern {rule.pattern!r} matched {len(outside)} module(s) outside the scope "
            f"{rule.scope!r}{target}: {', '.join(outside)}"
        )
    if rule.required_type is not None:
        wrong = [
            f"{name} ({type(module).__name__})" for name, module in matches if not isinstance(module, rule.required_type)
        ]
        if wrong:
            raise ReplacementError(
                f"rule {rule.name}: pattern {rule.pattern!r} matched module(s) that are not "
                f"{_type_names(rule.required_type)}{target}: {', '.join(wrong)}"
            )
    if len(matches) != expected:
        raise ReplacementError(
            f"rule {rule.name}: pattern {rule.pattern!r} matched {len(matches)} module(s), expected {expected}"
            f"{target}: {', '.join(name for name, _ in matches)}"
        )
    return matches


def _check_no_overlap(planned: Mapping[str, list[tuple[str, Any]]]) -> None:
    # Two rules on one module, or on a module and its descendant, would replace something that the
    # other rule's replacement no longer contains.
    owners: dict[str, str] = {}
    for rule_name, matches in planned.items():
        for name, _ in matches:
            for other, other_rule in owners.items():
                if name == other or name.startswith(other + ".") or other.startswith(name + "."):
                    raise ReplacementError(f"rules {other_rule} and {rule_name} both reach {other} / {name}")
            owners[name] = rule_name


def _set_submodule(model, name: str, replacement) -> None:
    parent_name, _, child_name = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child_name, replacement)


def _sample_names(model, scope: str, limit: int = 12) -> str:
    names = [name for name, _ in model.named_modules() if name and fnmatch.fnmatchcase(name, scope)]
    shown = ", ".join(names[:limit])
    return f"{shown}, ..." if len(names) > limit else shown or "(none in scope)"


def _type_names(types: type | tuple[type, ...]) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(t.__name__ for t in types)
