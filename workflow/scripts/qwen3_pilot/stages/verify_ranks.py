"""Stage verify_ranks: the configured ranks launched and checked, their collectives timed, and the 64-rank FSDP plan
validated offline; measured only (measured.json): what holds the bandwidth to a floor is
stages/verify_ranks_judging.py, which this module never imports (a floor edit re-judges, parse_time/code.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..ranks import verify_ranks


def hbm_budget(configured_gib: float, topology: dict[str, Any] | None) -> tuple[float, str]:
    """The plan's HBM budget per rank: the configured one (plan.hbm_per_rank_gib, by default a trn2 rank's share of
    a chip's HBM), or what neuron-ls reports per logical core (= per rank) where that is smaller, and where the
    figure came from."""
    measured = (topology or {}).get("hbm_per_rank_gib")
    if measured is not None and measured < configured_gib:
        return measured, (f"neuron-ls: {measured:g} GiB per logical core (below plan.hbm_per_rank_gib "
                          f"{configured_gib:g})")
    if measured is not None:
        return configured_gib, (f"plan.hbm_per_rank_gib {configured_gib:g} GiB (neuron-ls reports {measured:g} per "
                                "logical core)")
    return configured_gib, f"plan.hbm_per_rank_gib {configured_gib:g} GiB (no neuron-ls on this backend)"


def run(
    *, backend_config: dict[str, Any], plan: dict[str, Any], collectives: dict[str, Any], cache_root: str,
    ranks_dir: Path, plan_path: Path, measured_path: Path, log_path: Path,
) -> dict[str, Any]:
    """The ranks launched and checked, their collectives timed (and the vendor's benchmark beside them where the
    backend has one), and the FSDP plan: measured.json, which rule judge holds to verify_ranks.floor
    (stages/verify_ranks_judging.py)."""
    from ..backends import make_backend
    from ..rank_plan import run_plan_subprocess
    from ..summary import StageMeasurement

    backend = make_backend(backend_config, str(Path(cache_root).resolve()))
    live = verify_ranks(backend, ranks_dir, log_path, collectives=collectives)
    budget, budget_source = hbm_budget(plan["hbm_per_rank_gib"], live.get("topology"))
    fsdp_plan = run_plan_subprocess(
        flavor=plan["flavor"], world_size=plan["world_size"], hbm_per_rank_gib=budget, out_path=plan_path,
    )
    fsdp_plan["hbm_budget_source"] = budget_source
    figures = {"live": live, "plan": fsdp_plan, "collectives": collectives}
    if backend.vendor_collectives is not None:
        figures["vendor_collectives"] = backend.vendor_collectives(collectives, ranks_dir / "vendor", log_path)
    measurement = StageMeasurement(stage="verify_ranks", backend=backend.name, figures=figures)
    measurement.add_artifacts(sorted(ranks_dir.glob("rank-*.json")) + [plan_path])
    return measurement.write(measured_path)
