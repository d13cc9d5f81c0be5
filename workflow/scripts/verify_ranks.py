from pathlib import Path

from qwen3_pilot.stage_run import StageRun
from qwen3_pilot.stages.verify_ranks import run

with StageRun.of_job(snakemake) as stage_run:
    run(
        backend_config=snakemake.params.backend,
        plan=snakemake.params.plan,
        collectives=snakemake.params.collectives,
        cache_root=stage_run.cache_root,
        ranks_dir=Path(snakemake.output.ranks),
        plan_path=Path(snakemake.output.plan),
        measured_path=Path(snakemake.output.measured),
        log_path=stage_run.log_path,
    )
