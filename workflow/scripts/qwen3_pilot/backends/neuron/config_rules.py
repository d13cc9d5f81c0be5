"""The neuron backend's rules on the configuration, checked at parse time after `validate()` (parse_time.config asks
the configured backend for its config_problems), and the trn2 topology they rest on. Torch-free: the Snakefile
imports it."""

from __future__ import annotations

from typing import Any

from .kernel_limits import NKI_ROPE_TILE, required_seq_multiple


def expected_neuron_ranks(neuron: dict[str, Any]) -> int:
    """One rank per logical core: chips x cores per chip / LNC."""
    return neuron["chips"] * neuron["cores_per_chip"] // neuron["lnc"]


def hbm_per_rank_gib(neuron: dict[str, Any]) -> float:
    """A rank's share of a chip's HBM: one rank per logical core, cores_per_chip / lnc of them per chip (96 GiB
    / 4 = 24 at LNC=2, 96 / 8 = 12 at LNC=1)."""
    share = neuron["hbm_per_chip_gib"] / (neuron["cores_per_chip"] / neuron["lnc"])
    # A whole number stays an int: the same figure a config wrote as 24 must not read as a changed param (24.0)
    # and rerun verify_ranks and everything after it.
    return int(share) if float(share).is_integer() else share


def config_problems(config: dict[str, Any]) -> list[str]:
    """Every rule of the neuron backend the config breaks, each naming the key, the value and what is allowed."""
    problems = []
    neuron, training = config["neuron"], config["training"]
    lnc = neuron["lnc"]
    multiple = required_seq_multiple(lnc)
    for key, seq_len in (("training.seq_len", training["seq_len"]),
                         ("fail_fast.seq_len", config["fail_fast"]["seq_len"])):
        if seq_len % multiple:
            problems.append(f"{key} = {seq_len}: must be a multiple of {NKI_ROPE_TILE} x neuron.lnc = {multiple} "
                            "(the NKI RoPE kernel's tile)")
    if (neuron["cores_per_chip"] % lnc) != 0:
        problems.append(
            f"neuron.cores_per_chip = {neuron['cores_per_chip']}: must be divisible by neuron.lnc = {lnc}"
        )
    elif config["ranks"] != expected_neuron_ranks(neuron):
        problems.append(
            f"ranks = {config['ranks']}: on the neuron backend it must equal chips x cores_per_chip / lnc "
            f"= {neuron['chips']} x {neuron['cores_per_chip']} / {lnc} = {expected_neuron_ranks(neuron)}"
        )
    if training["attention"] != "sdpa":
        problems.append(
            f"training.attention = {training['attention']!r}: flex attention compiles with inductor and Triton, "
            "which the neuron backend does not have; allowed on neuron: 'sdpa'"
        )
    if config["weights"]["source"] == "fixture":
        problems.append(
            "weights.source = 'fixture': the neuron backend trains the published weights; allowed: 'hub'"
        )
    for key in ("benchmark", "fail_fast"):
        if config[key]["compile_backend"] != "default":
            problems.append(f"{key}.compile_backend = {config[key]['compile_backend']!r}: the neuron backend compiles "
                            "with its own (torch-neuronx's); allowed on neuron: 'default'")
    return problems
