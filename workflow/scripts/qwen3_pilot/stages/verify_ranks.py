"""Stage verify_ranks: the configured ranks launched and checked, and the 64-rank FSDP plan validated offline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..ranks import verify_ranks


def hbm_budget(configured_gib: float, topology: dict[str, Any] | None) -> tuple[float, str]:
    """The plan's HBM budget per rank: the configured one (plan.hbm_per_rank_gib, by default a chip's HBM at
    neuron.lnc), or what neuron-ls reports per logical core (= per rank) where that is smaller, and where the
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
    ranks_dir: Path, plan_path: Path, summary_path: Path, log_path: Path,
) -> dict[str, Any]:
    from ..backends import make_backend
    from ..rank_plan import run_plan_subprocess
    from ..summary import StageSummary

    backend = make_backend(backend_config, str(Path(cache_root).resolve()))
    live = verify_ranks(backend, ranks_dir, log_path, collectives=collectives)
    budget, budget_source = hbm_budget(plan["hbm_per_rank_gib"], live.get("topology"))
    fsdp_plan = run_plan_subprocess(
        flavor=plan["flavor"], world_size=plan["world_size"], hbm_per_rank_gib=budget, out_path=plan_path,
    )
    fsdp_plan["hbm_budget_source"] = budget_source
    summary = StageSummary(
        stage="verify_ranks",
        status="pass",
        backend=backend.name,
        figures={"live": live, "plan": fsdp_plan},
        proves=(
            f"{live['ranks_seen']} ranks on {len(live['hosts'])} host(s) ({', '.join(live['hosts'])}) joined one "
            f"{live['dist_backend']} process group with the expected rank numbers and world size, and an all-reduce "
            "and an all-gather returned the known results on "
            f"every rank; all-reduce, all-gather, reduce-scatter and all-to-all returned the known result on every "
            f"rank at {', '.join(f'{size:g}' for size in collectives['sizes_mib'])} MiB, each timed over "
            f"{collectives['iterations']} calls (the slowest rank's mean) with algorithm and bus bandwidth as "
            f"nccl-tests defines them. The {plan['world_size']}-way FSDP plan of the real Qwen3-{plan['flavor']} "
            "architecture (torchtitan fake process group) fits the per-rank HBM budget for parameters, gradients "
            "and AdamW state."
        ),
        does_not_prove=(
            (f"These were gloo ranks on {'one CPU machine' if live['nodes'] == 1 else 'CPU hosts'}, not the "
             "NeuronCores of a trn2. " if backend.name == "cpu" else "")
            + "The plan counts static memory only: activations, compiler workspace and communication buffers "
            "are not in it, and the fake process group moves no data. The bandwidths are this launch's, through "
            f"torch.distributed's {live['dist_backend']} process group, held to no floor yet; one launch is one "
            "sample."
        ),
    )
    summary.add_artifacts(sorted(ranks_dir.glob("rank-*.json")) + [plan_path])
    return summary.write(summary_path)
