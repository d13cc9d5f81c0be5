"""Kernel-backed replacements for torchtitan Qwen3 modules: what each kernel replaces, which implementation
of it runs in this process, and the one log line each replaced module writes when it is built.

- `rope`: RoPE as the custom op `qwen3_pilot::rope_hf` (HF layout, own autograd); on neuron the NKI
  Library's `rope_hf` kernel, on cpu plain PyTorch of the same contract. `HFLayoutRoPE` takes the place
  of each attention layer's `CosSinRoPE`.
- `moe`: the routed experts' grouped matmul (`torch._grouped_mm`, as torchtitan's `GroupedExperts`)
  and the per-expert loop it is checked against. `KernelGroupedExperts` takes the place of each MoE
  layer's `GroupedExperts`.

This module is torch-free (the training stages parse the log lines with it); the submodules import torch
and torchtitan, in the trainer processes and the numerics stage only.
"""

from __future__ import annotations

import fnmatch
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Kernel:
    name: str
    # The module each targeted layer must hold exactly one of, as an fnmatch pattern relative to the layer.
    module: str
    # torchtitan's class that the kernel's module takes the place of.
    replaces: str


KERNELS = {
    "rope_hf": Kernel("rope_hf", module="attention.rope", replaces="CosSinRoPE"),
    "moe_grouped_experts": Kernel(
        "moe_grouped_experts", module="moe.routed_experts.inner_experts", replaces="GroupedExperts"
    ),
}

# Which implementation of each kernel runs in this process. The backend sets these when it installs its
# kernels (backends.<name>.install_kernels); recipes and the replacement converter never choose.
_IMPLEMENTATIONS = {
    "rope_hf": "PyTorch: qwen3_pilot::rope_hf composite (float32 inside, one rounding)",
    "moe_grouped_experts": "torch._grouped_mm on the model's device",
}


def set_implementation(kernel: str, description: str) -> None:
    _IMPLEMENTATIONS[known_kernel(kernel).name] = description


def implementation(kernel: str) -> str:
    return _IMPLEMENTATIONS[known_kernel(kernel).name]


def known_kernel(name: str) -> Kernel:
    if name not in KERNELS:
        raise ValueError(f"kernel {name!r}: unknown; known kernels: {', '.join(sorted(KERNELS))}")
    return KERNELS[name]


class ReplacedConfig:
    """Marks the config of a kernel-backed module (its class declares `kernel` and `module_path`), so a
    second replacement rule can tell it from the torchtitan config it took the place of."""

    __slots__ = ()


# ---- the launch-log line: written when a replaced module is built, read back by the training stages ----

LOG_MARKER = "kernel replacement:"
# The implementation runs to the end of the line: it may hold brackets itself ("rope_hf[2]").
_LOG_LINE = re.compile(
    re.escape(LOG_MARKER) + r" (?P<kernel>\S+) (?P<path>layers\.(?P<layer>[^.\s]+)\.\S+) "
    r"(?P<source>\S+) -> (?P<target>\S+) \[(?P<impl>.*)\][ \t]*\r?$",
    re.MULTILINE,
)


def replacement_line(kernel: str, module_path: str, source: str, target: str) -> str:
    return f"{LOG_MARKER} {kernel} {module_path} {source} -> {target} [{implementation(kernel)}]"


def log_replacement(config: Any, target: str) -> None:
    """One line per replaced module as the model is built; rank 0 only, so a line counts a module, not a
    module times the ranks."""
    if os.environ.get("RANK", "0") != "0" or not config.module_path:
        return
    # stdout, not a logger: the line must reach the launch log whether or not torchtitan's logger is set up yet,
    # and exactly once (a logger with two handlers would write it twice and fail the count). One write with its
    # newline: print's text and end are two writes, and unbuffered (torchrun's ranks) another rank's warning landed
    # between them once, glued to the line's end so that the count missed it.
    sys.stdout.write(replacement_line(config.kernel, config.module_path, KERNELS[config.kernel].replaces, target)
                     + "\n")
    sys.stdout.flush()


def parse_replacement_lines(text: str) -> list[dict[str, str]]:
    """Every replacement line in a launch's output, in order."""
    return [match.groupdict() for match in _LOG_LINE.finditer(text)]


def targeted_layers(n_layers: int, layers_pattern: str) -> list[str]:
    """The layer names ("0", "1", ...) a rule's `layers` fnmatch pattern selects."""
    return [str(i) for i in range(n_layers) if fnmatch.fnmatchcase(str(i), layers_pattern)]


def replacement_log_problems(
    lines: Iterable[dict[str, str]], rules: Iterable[dict[str, str]], n_layers: int
) -> list[str]:
    """Exactly one replacement per targeted layer for each configured kernel, and none elsewhere; each
    problem names the kernel and the layers with none, with two or more, or outside the rule."""
    lines = list(lines)
    problems = []
    for rule in rules:
        kernel = rule["kernel"]
        expected = targeted_layers(n_layers, rule["layers"])
        per_layer: dict[str, list[str]] = {}
        for line in lines:
            if line["kernel"] == kernel:
                per_layer.setdefault(line["layer"], []).append(line["path"])
        missing = [layer for layer in expected if layer not in per_layer]
        repeated = {layer: paths for layer, paths in per_layer.items() if len(paths) > 1}
        outside = sorted(set(per_layer) - set(expected), key=_layer_order)
        if missing:
            problems.append(f"{kernel}: no replacement logged in layer(s) {', '.join(missing)} "
                            f"(expected one in each of layers {_layer_list(expected)})")
        for layer, paths in sorted(repeated.items(), key=lambda item: _layer_order(item[0])):
            problems.append(f"{kernel}: {len(paths)} replacements logged in layer {layer}: {', '.join(paths)}")
        if outside:
            problems.append(f"{kernel}: replacements logged in layer(s) {', '.join(outside)}, outside the rule's "
                            f"layers {rule['layers']!r}")
    configured = {rule["kernel"] for rule in rules}
    unexpected = sorted({line["kernel"] for line in lines} - configured)
    if unexpected:
        problems.append(f"replacements logged for kernel(s) {', '.join(unexpected)}, which this run did not configure")
    return problems


def _layer_order(layer: str):
    return (0, int(layer)) if layer.isdigit() else (1, layer)


def _layer_list(layers: list[str]) -> str:
    return ", ".join(layers) if len(layers) <= 8 else f"{layers[0]}..{layers[-1]} ({len(layers)} layers)"
