"""How a recorded figure reads on a page (report.html, preflight.html): the one formatting layer between a stage's
raw record and the text a reviewer sees.

- Labels come from the figure's key, with the unit in the label ("step_time_s" -> "step time (s)", "peak_memory_gib"
  -> "peak memory (GiB)", a loss or a gap in nats).
- Numbers get the digits that fit them: losses 4 significant digits, percentages 1 decimal, other measurements 3
  significant digits, counts with thousands separators. Exact values (sha256, commits, versions, thresholds and
  tolerances, config values a figure echoes) are shown as recorded and marked exact.
- Nested records become labelled tables: a dict is flattened into label/value rows ("gate > gap (nats)"), a dict of
  like records (one per recipe, per model, per kernel) into one table with a row each, a list of records into a
  table (turned on its side when it has more columns than rows, so that it fits a page and an A4 sheet), a long
  list of numbers into its count, range and median.

report.json keeps every raw value; nothing here changes what a stage measured or decided.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

# Words of a key that are its unit, shown in brackets after the label.
UNIT_WORDS = {"s": "s", "gib": "GiB", "pct": "%", "bytes": "bytes", "nats": "nats", "us": "µs", "gbps": "GB/s",
              "mib": "MiB"}
# Words shown otherwise than written.
WORDS = {"mfu": "MFU", "hf": "HF", "cv": "CV", "fsdp": "FSDP", "hbm": "HBM", "tflops": "TFLOP/s", "lnc": "LNC",
         "gpu": "GPU", "ln": "ln", "argmax": "argmax", "moe": "MoE", "p10": "p10", "p90": "p90"}
# Whole keys with their own label.
LABELS = {"peak_flops_per_rank": "peak FLOP/s per rank", "ln_vocab": "ln(vocab size) (nats)",
          "abs_difference": "|difference| (nats)", "max_abs_diff": "max |diff|", "logits_max_abs": "logits max |x|",
          "max_ulp_diff": "max |diff| (ulps)",
          "max_abs_loss_diff": "max |loss diff| (nats)", "grad_max_abs_diff": "grad max |diff|",
          "logits_max_abs_diff": "logits max |diff|", "max_over_mean": "max / mean", "abs_diff": "|diff|",
          "step1_loss_train_hf": "step-1 loss, train_hf (nats)",
          "step1_loss_train_native": "step-1 loss, train_native (nats)",
          "random_init_train_hf": "random-init step-1 loss, train_hf (nats)",
          "random_init_train_native": "random-init step-1 loss, train_native (nats)"}
# Words of a key that make it a loss in nats.
LOSS_WORDS = {"loss", "losses", "gap", "ln"}
# A value is exact (shown as recorded, never rounded) when a word of its key is one of these, or its whole key is.
EXACT_WORDS = {"sha256", "commit", "revision", "version", "versions", "installed", "pinned", "tolerance", "threshold"}
# A parity table's built and checkpoint columns echo config.json values.
EXACT_KEYS = {"built", "checkpoint", "min_gap", "rope_theta", "rms_norm_eps", "lr", "seed", "required_multiple",
              "max_position_embeddings"}
# Scalars in a list shown one by one up to this many; a longer list is summarised.
LIST_SHOWN = 8
# Columns that name a record, shown first (summaries are written with their keys sorted).
NAMING = ("", "recipe", "run", "phase", "step", "layer", "section", "op", "dtype", "field", "kernel",
          "package", "collective", "size_mib")
# A list of records with more columns than this (and fewer rows than columns) is shown turned on its side.
WIDE = 7


def number(value: float, digits: int = 3) -> str:
    """`digits` significant digits, without an exponent for the figures a stage records (1e-4 .. 1e7)."""
    if value == 0:
        return "0"
    text = f"{value:.{digits}g}"
    if "e" in text and 1e-4 <= abs(value) < 1e7:
        text = f"{value:,.{max(0, digits - len(str(int(abs(value)))))}f}"
    return text


def words(key: str) -> list[str]:
    return str(key).lower().replace(" ", "_").split("_")


def label(key: str) -> str:
    """The key as words, with its unit: "mean_step_time_s_after_step_1" -> "mean step time after step 1 (s)",
    "tokens_per_s" -> "tokens/s". Keys that are not identifiers ("fetched weights") are left as they are."""
    key = str(key)
    if key in LABELS:
        return LABELS[key]
    if " " in key or not key:
        return key
    parts, unit, shown = words(key), None, []
    index = 0
    while index < len(parts):
        part = parts[index]
        if part == "per" and index + 1 < len(parts) and parts[index + 1] == "s" and shown:
            shown[-1] += "/s"
            index += 2
            continue
        if part in UNIT_WORDS and unit is None and shown:
            unit = UNIT_WORDS[part]
        else:
            shown.append(WORDS.get(part, part))
        index += 1
    if unit is None and LOSS_WORDS & set(parts):
        unit = "nats"
    return " ".join(shown) + (f" ({unit})" if unit else "")


def is_exact(key: str) -> bool:
    return str(key) in EXACT_KEYS or bool(EXACT_WORDS & set(words(key)))


def text(key: str, value: Any) -> str:
    """One scalar (or a short list of them) as the page shows it, by what its key says it is."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "none"
    if isinstance(value, str):
        return value
    if is_exact(key):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        parts = set(words(key))
        if "pct" in parts:
            return f"{value:,.1f}"
        return number(value, 4 if LOSS_WORDS & parts else 3)
    if isinstance(value, list) and is_scalar_like(value):
        if len(value) <= LIST_SHOWN:
            return ", ".join(text(key, item) for item in value) or "none"
        numbers = [item for item in value if isinstance(item, (int, float)) and not isinstance(item, bool)]
        if len(numbers) == len(value):
            middle = statistics.median(numbers)
            return f"{len(value)} values: min {text(key, min(numbers))}, median {text(key, middle)}, max " + text(
                key, max(numbers))
        return ", ".join(text(key, item) for item in value[:LIST_SHOWN]) + f" ... ({len(value)} in all)"
    return str(value)


def exact_text(value: Any) -> str:
    """A value shown exactly as configured or recorded (a config echo, a version): scalars as YAML writes them,
    lists joined, mappings as key: value pairs; never JSON text."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ", ".join(exact_text(item) for item in value) + "]"
    if isinstance(value, dict):
        return "; ".join(f"{key}: {exact_text(item)}" for key, item in value.items())
    return str(value)


@dataclass
class Cell:
    text: str
    exact: bool = False


@dataclass
class Block:
    """One table of the page: `rows` of cells under `columns`, or label/value rows when `columns` is empty."""

    caption: str
    columns: list[str] = field(default_factory=list)
    rows: list[list[Cell]] = field(default_factory=list)


def cell(key: str, value: Any) -> Cell:
    return Cell(text(key, value), exact=is_exact(key) and value is not None and not isinstance(value, bool))


def is_records(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(row, dict) for row in value)


def is_scalar_like(value: Any) -> bool:
    return not isinstance(value, (dict, list)) or (
        isinstance(value, list) and all(not isinstance(item, (dict, list)) for item in value))


def flat(record: dict[str, Any], prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """A record's scalars (and lists of scalars) by key path; nested dicts flattened, lists of records dropped
    (they are tables of their own)."""
    out: dict[tuple[str, ...], Any] = {}
    for key, value in record.items():
        if isinstance(value, dict) and value:
            out |= flat(value, (*prefix, str(key)))
        elif is_scalar_like(value):
            out[(*prefix, str(key))] = value
    return out


def path_label(path: tuple[str, ...]) -> str:
    """The labels of a key path joined; a unit its last key lacks comes from a key above ("launch_wall_s" >
    "fetched weights" reads "launch wall > fetched weights (s)")."""
    labels = [label(key) for key in path]
    if not labels[-1].endswith(")"):
        for above in reversed(labels[:-1]):
            if above.endswith(")"):
                unit = above[above.rindex(" ("):]
                labels = [part.removesuffix(unit) for part in labels[:-1]] + [labels[-1] + unit]
                break
    return " > ".join(labels)


def unit_key(path: tuple[str, ...]) -> str:
    """The key that says how a value at `path` is formatted: its own, or the nearest above with a unit."""
    for key in reversed(path):
        if label(key).endswith(")") or is_exact(key):
            return key
    return path[-1]


def records_block(caption: str, rows: list[dict[str, Any]]) -> Block:
    flattened = [flat(row) for row in rows]
    paths = list(dict.fromkeys(path for row in flattened for path in row))
    paths.sort(key=lambda path: NAMING.index(path[0]) if len(path) == 1 and path[0] in NAMING else len(NAMING))
    if len(paths) > WIDE and len(rows) < len(paths):
        # On its side: one row per figure, one column per record, headed by the record's first value.
        heads = [text(paths[0][-1], row.get(paths[0], "")) for row in flattened]
        return Block(caption, [path_label(paths[0]), *heads],
                     [[Cell(path_label(path)), *(cell(unit_key(path), row.get(path, "")) for row in flattened)]
                      for path in paths[1:]])
    return Block(caption, [path_label(path) for path in paths],
                 [[cell(unit_key(path), row.get(path, "")) for path in paths] for row in flattened])


def like_groups(record: dict[str, Any]) -> list[list[str]]:
    """Keys of `record` whose values are records with the same keys (one per recipe, per model, per kernel), two or
    more: each group is shown as one table with a row per key."""
    by_keys: dict[frozenset, list[str]] = {}
    for key, value in record.items():
        if isinstance(value, dict) and value:
            by_keys.setdefault(frozenset(flat(value)), []).append(key)
    return [keys for keys in by_keys.values() if len(keys) > 1]


def blocks(figures: dict[str, Any], caption: str = "") -> list[Block]:
    """A stage's figures as the page's tables: the first lists every scalar by its labelled path; each nested list
    of records, and each set of like records, follows as a table of its own, captioned by its path."""
    pairs = Block(caption)
    tables: list[Block] = []

    def walk(record: dict[str, Any], prefix: tuple[str, ...]) -> None:
        grouped = {key: keys for keys in like_groups(record) for key in keys}
        for key, value in record.items():
            path = (*prefix, str(key))
            if key in grouped:
                keys = grouped[key]
                if key == keys[0]:
                    title = path_label(prefix) + " > " if prefix else ""
                    tables.append(records_block(title + ", ".join(label(k) for k in keys),
                                                [{"": name, **record[name]} for name in keys]))
                # their own lists of records, each a table of its own
                walk({k: v for k, v in value.items() if is_records(v)}, path)
            elif is_records(value):
                tables.append(records_block(path_label(path), value))
            elif isinstance(value, dict) and value:
                walk(value, path)
            elif isinstance(value, dict):
                pairs.rows.append([Cell(path_label(path)), Cell("none")])
            else:
                pairs.rows.append([Cell(path_label(path)), cell(unit_key(path), value)])

    walk(figures, ())
    return ([pairs] if pairs.rows else []) + tables


def figure_path_text(path: str, value: Any) -> Cell:
    """A figure named by its dotted path (changes.py's "gate.gap", "steps[3].loss") with its value."""
    keys = [part.split("[")[0] for part in path.split(".") if part.split("[")[0]]
    return cell(unit_key(tuple(keys)) if keys else path, value)
