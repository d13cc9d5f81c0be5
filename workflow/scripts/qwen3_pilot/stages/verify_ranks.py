"""Stage verify_ranks: the configured ranks launched and checked, and the 64-rank FSDP plan validated offline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..ranks import verify_ranks


def run(
    *, backend_config: dict[str, Any], plan: dict[str, Any], cache_root: str,
    ranks_dir: Path, plan_path: Path, summary_path: Path, log_path: Path,
) -> dict[str, Any]:
    from ..backends import make_backend
    from ..rank_plan import run_plan_subprocess
    from ..summary import StageSummary

    backend = make_backend(backend_config, str(Path(cache_root).resolve()))
    live = verify_ranks(backend, ranks_dir, log_path)
    fsdp_plan = run_plan_subprocess(
        flavor=plan["flavor"], world_size=plan["world_size"], hbm_per_rank_gib=plan["hbm_per_rank_gib"],
        out_path=plan_path,
    )
    summary = StageSummary(
        stage="verify_ranks",
        status="pass",
        backend=backend.name,
        figures={"live": live, "plan": fsdp_plan},
        proves=(
            f"{live['ranks_seen']} ranks on {len(live['hosts'])} host(s) ({', '.join(live['hosts'])}) joined one "
            f"{live['dist_backend']} process group with the expected rank numbers and world size, and an all-reduce "
            "and an all-gather returned the known results on "
            f"every rank. The {plan['world_size']}-way FSDP plan of the real Qwen3-{plan['flavor']} architecture "
            "(torchtitan fake process group) fits the per-rank HBM budget for parameters, gradients and AdamW state."
        ),
        does_not_prove=(
            (f"These were gloo ranks on {'one CPU machine' if live['nodes'] == 1 else 'CPU hosts'}, not the "
             "NeuronCores of a trn2. " if backend.name == "cpu" else "")
            + "The plan counts static memory only: activations, compiler workspace and communication buffers "
            "are not in it, and the fake process group moves no data."
        ),
    )
    summary.add_artifacts(sorted(ranks_dir.glob("rank-*.json")) + [plan_path])
    return summary.write(summary_path)
