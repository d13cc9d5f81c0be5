from pathlib import Path

from qwen3_pilot.stage_run import StageRun
from qwen3_pilot.stages.fetch_weights import run

with StageRun.of_job(snakemake) as stage_run:
    run(
        weights=snakemake.params.weights,
        cache_dir=Path(snakemake.params.cache_dir),
        offline=snakemake.params.offline,
        backend=snakemake.params.backend,
        out_dir=Path(snakemake.output.checkpoint),
        manifest_path=Path(snakemake.output.manifest),
        summary_path=Path(snakemake.output.summary),
    )
