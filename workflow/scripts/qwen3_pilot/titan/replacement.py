"""The kernel replacement registry as torchtitan's own mechanism: a `ModelConfigConverter` that swaps the
*configuration* of the intended modules before the model is built (as torchtitan's LoRA and quantization
converters do), so the trainer builds, shards, initialises and checkpoints the replaced model as it would
the original.

One `KernelReplacement.Config` per kernel (`kernels.KERNELS`): `layers` is an fnmatch pattern over the
layer names ("*" every layer, "[0-1]" the first two, "3" one), `module` an fnmatch pattern over the module
paths inside a layer (default: the kernel's own module, e.g. "attention.rope"). The converter checks the
whole tree before it replaces anything, so a rule that fails leaves the config as it was:

- every targeted layer must hold exactly one matching module (none: a renamed torchtitan submodule would
  otherwise turn the kernel off without a word; two: a pattern that also catches a sibling);
- each match must be the config of the class the kernel replaces (a ComplexRoPE where a CosSinRoPE was
  meant is an error), and not one another rule already replaced.

Runs in the trainer processes, the numerics stage and the preflight (all of which import torchtitan).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, fields

from torchtitan.protocols.model import ModelConfigConverter
from torchtitan.protocols.module import Module

from .kernels import KERNELS, ReplacedConfig, known_kernel, targeted_layers


class ReplacementError(ValueError):
    pass


def _source_and_target(kernel: str):
    """torchtitan's config class the kernel replaces, and the kernel module's class."""
    if kernel == "rope_hf":
        from torchtitan.models.common.rope import CosSinRoPE

        from .kernels.rope import HFLayoutRoPE

        return CosSinRoPE.Config, HFLayoutRoPE
    if kernel == "moe_grouped_experts":
        from torchtitan.models.common.moe import GroupedExperts

        from .kernels.moe import KernelGroupedExperts

        return GroupedExperts.Config, KernelGroupedExperts
    # A kernel in KERNELS without its pair here would otherwise be checked against another kernel's classes.
    raise ValueError(f"kernel {kernel!r}: no source and target classes in replacement._source_and_target")


class KernelReplacement(ModelConfigConverter):
    @dataclass(kw_only=True, slots=True)
    class Config(ModelConfigConverter.Config):
        kernel: str
        """A name in qwen3_pilot.titan.kernels.KERNELS."""

        layers: str = "*"
        """fnmatch pattern over the layer names ("0", "1", ...): which layers the rule targets."""

        module: str | None = None
        """fnmatch pattern over module paths inside a layer; None: the kernel's own module."""

    def __init__(self, config: Config, **kwargs):
        self.config = config
        self.kernel = known_kernel(config.kernel)
        self.module = config.module or self.kernel.module

    def convert(self, model_config: Module.Config) -> Module.Config:
        planned = self.plan(model_config)
        source_cls, target_cls = _source_and_target(self.kernel.name)
        for path, cfg, parent, attr in planned:
            values = {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.init}
            replaced = target_cls.Config(**values, kernel=self.kernel.name, module_path=path)
            if isinstance(parent, list):
                parent[attr] = replaced
            else:
                setattr(parent, attr, replaced)
        return model_config

    def plan(self, model_config: Module.Config) -> list[tuple[str, Module.Config, object, str | int]]:
        """(path, config, parent, field) of each module to replace, one per targeted layer; raises
        ReplacementError naming the layers and paths when a rule is wrong."""
        rule = f"{self.kernel.name} (layers {self.config.layers!r}, module {self.module!r})"
        n_layers = len(model_config.layers)
        layers = targeted_layers(n_layers, self.config.layers)
        if not layers:
            raise ReplacementError(f"rule {rule}: the layers pattern selects none of the model's {n_layers} layers")
        matches: dict[str, list] = {layer: [] for layer in layers}
        for path, cfg, parent, attr in model_config.traverse(Module.Config, recurse=True):
            parts = path.split(".", 2)
            if len(parts) == 3 and parts[0] == "layers" and parts[1] in matches:
                if fnmatch.fnmatchcase(parts[2], self.module):
                    matches[parts[1]].append((path, cfg, parent, attr))
        source_cls, _ = _source_and_target(self.kernel.name)
        problems = []
        none = [layer for layer, found in matches.items() if not found]
        if none:
            problems.append(f"no module matches in layer(s) {', '.join(none)}")
        for layer, found in matches.items():
            if len(found) > 1:
                problems.append(f"{len(found)} modules match in layer {layer}: {', '.join(p for p, *_ in found)}")
        single = [found[0] for found in matches.values() if len(found) == 1]
        wrong = [f"{path} ({type(cfg).__qualname__})" for path, cfg, *_ in single if not isinstance(cfg, source_cls)]
        if wrong:
            problems.append(f"not a {source_cls.__qualname__}: {', '.join(wrong)}")
        taken = [f"{path} (by {cfg.kernel})" for path, cfg, *_ in single if isinstance(cfg, ReplacedConfig)]
        if taken:
            problems.append(f"already replaced: {', '.join(taken)}")
        if problems:
            raise ReplacementError(f"rule {rule}: " + "; ".join(problems))
        return single


def kernel_converters(rules: list[dict]) -> list[KernelReplacement.Config]:
    """Converter configs from the rules as config and recipes hold them: {kernel, layers, module}."""
    return [
        KernelReplacement.Config(kernel=rule["kernel"], layers=rule.get("layers", "*"), module=rule.get("module"))
        for rule in rules
    ]


def apply_converters(model_config: Module.Config, converters: list[ModelConfigConverter.Config]) -> Module.Config:
    """What `model_registry(flavor, converters=...)` does to a registered flavor, for a model config
    built from a checkpoint's config.json (which no registry flavor holds)."""
    from torchtitan.models.utils import validate_converter_order

    validate_converter_order(converters)
    for converter in converters:
        model_config = converter.build().convert(model_config)
    return model_config


def replaced_paths(model_config: Module.Config) -> dict[str, list[str]]:
    """{kernel: [module path, ...]} of the replaced configs in a model config (for the preflight's counts)."""
    found: dict[str, list[str]] = {name: [] for name in KERNELS}
    for path, cfg, _, _ in model_config.traverse(ReplacedConfig, recurse=True):
        found[cfg.kernel].append(path)
    return {kernel: paths for kernel, paths in found.items() if paths}
