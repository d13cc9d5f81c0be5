"""Config parity: what a recipe built against the checkpoint's config.json, field by field.

Torch-free, so the stage and the report can read it; the values of the built models come from
`in_ranks/recipes.py`, inside the trainer processes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..problems import problem_list

# The architecture fields both recipes must take from the checkpoint, in config.json's names.
PARITY_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "rope_theta",
    "rms_norm_eps",
    "tie_word_embeddings",
    "max_position_embeddings",
)


class ParityError(ValueError):
    pass


def rope_theta(hf_config: dict[str, Any], source: str = "config.json") -> float:
    """RoPE theta from a transformers v5 config (rope_parameters) or a v4 one (top-level rope_theta);
    a config that carries both with different values is refused rather than guessed."""
    parameters = hf_config.get("rope_parameters") or {}
    rope_type = parameters.get("rope_type", "default")
    if rope_type != "default":
        raise ParityError(f"{source}: rope_parameters.rope_type = {rope_type!r}; supported: 'default'")
    nested, top = parameters.get("rope_theta"), hf_config.get("rope_theta")
    if nested is not None and top is not None and float(nested) != float(top):
        raise ParityError(
            f"{source}: rope theta mismatch: rope_parameters.rope_theta = {nested} but rope_theta = {top}"
        )
    theta = nested if nested is not None else top
    if theta is None:
        raise ParityError(f"{source}: no rope_theta (neither rope_parameters.rope_theta nor rope_theta)")
    return float(theta)


def checkpoint_values(hf_config: dict[str, Any], source: str = "config.json") -> dict[str, Any]:
    """The parity fields of a Qwen3 config.json, after checking it describes a model both recipes build."""
    if hf_config.get("model_type") != "qwen3":
        raise ParityError(f"{source}: model_type = {hf_config.get('model_type')!r}; expected 'qwen3'")
    missing = [f for f in PARITY_FIELDS if f not in ("rope_theta", "tie_word_embeddings") and f not in hf_config]
    if missing:
        raise ParityError(f"{source}: missing keys {', '.join(missing)}")
    for key, required in (("attention_bias", False), ("hidden_act", "silu"), ("use_sliding_window", False)):
        if hf_config.get(key, required) != required:
            raise ParityError(f"{source}: {key} = {hf_config[key]!r}; the Qwen3 recipes need {required!r}")
    values = {f: hf_config.get(f) for f in PARITY_FIELDS}
    values["rope_theta"] = rope_theta(hf_config, source)
    values["tie_word_embeddings"] = bool(hf_config.get("tie_word_embeddings", False))
    return values


def read_checkpoint_values(checkpoint_dir: Path) -> dict[str, Any]:
    path = Path(checkpoint_dir) / "config.json"
    try:
        hf_config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ParityError(f"{path}: cannot read the checkpoint's config: {error}") from error
    return checkpoint_values(hf_config, str(path))


def _same(built: Any, expected: Any) -> bool:
    if isinstance(expected, float) or isinstance(built, float):
        return built is not None and expected is not None and math.isclose(float(built), float(expected), rel_tol=1e-9)
    return built == expected


ACCEPTED = "accepted difference"


def accepted_verdict(reason: str | None) -> str:
    """A parity row's verdict for an accepted difference: with its reason, or bare until the judge adds it."""
    return f"{ACCEPTED}: {reason}" if reason else ACCEPTED


def parity_table(
    built: dict[str, Any], checkpoint: dict[str, Any], accepted: Mapping[str, str | None]
) -> tuple[list[dict[str, Any]], list[str]]:
    """One row per field (built value, checkpoint value, verdict) and the problems that fail the stage.

    `accepted` maps a field to the reason its difference is accepted, or to None where the reason is added later
    (the ranks know the fields, rule judge the reasons: with_reasons); an accepted field that does not
    differ is reported too, so that stale exceptions do not linger in the config.
    """
    unknown = sorted(set(accepted) - set(PARITY_FIELDS))
    if unknown:
        raise ParityError(f"accepted_differences: unknown fields {unknown}; allowed: {', '.join(PARITY_FIELDS)}")
    rows, problems = [], []
    for field in PARITY_FIELDS:
        same = _same(built.get(field), checkpoint.get(field))
        if same:
            verdict = "match"
        elif field in accepted:
            verdict = accepted_verdict(accepted[field])
        else:
            verdict = "MISMATCH"
            problems.append(f"{field}: built {built.get(field)!r}, checkpoint config.json {checkpoint.get(field)!r}")
        rows.append({"field": field, "built": built.get(field), "checkpoint": checkpoint.get(field),
                     "verdict": verdict})
    return rows, problems


def with_reasons(rows: list[dict[str, Any]], reasons: Mapping[str, str]) -> list[dict[str, Any]]:
    """The ranks' parity rows with each accepted difference's reason from the config; a difference the ranks
    accepted without a reason here means the run was made under other accepted fields than the judge's."""
    judged = []
    for row in rows:
        if row["verdict"] == ACCEPTED:
            if row["field"] not in reasons:
                raise ParityError(f"{row['field']}: accepted as a difference when the run was made, but not in "
                                  "the judge's accepted_differences: rerun the training stage")
            row = {**row, "verdict": accepted_verdict(reasons[row["field"]])}
        judged.append(row)
    return judged


def check_parity(
    recipe: str, built: dict[str, Any], checkpoint: dict[str, Any], accepted: dict[str, str], out_path: Path,
    *, writes_a_pass: bool = True,
) -> list[dict[str, Any]]:
    """Writes the table to `out_path` and raises on any difference not accepted. Each rank checks its own model;
    one that writes no passing table (`writes_a_pass` False: every rank but rank 0) still writes a failing one
    before it raises: the first rank to fail ends the launch (torchrun stops the others), which may be before
    rank 0 has written it. The ranks' tables are the same, and each write is a rename."""
    from ..artifacts import write_json

    rows, problems = parity_table(built, checkpoint, accepted)
    if problems or writes_a_pass:
        write_json(out_path, {"recipe": recipe, "rows": rows, "problems": problems})
    if problems:
        raise ParityError(
            problem_list(f"{recipe}: the model differs from the checkpoint's config.json", problems)
        )
    return rows
