from pathlib import Path

from qwen3_pilot.stagelog import stage_log
from qwen3_pilot.stages.fetch_weights import run

with stage_log(snakemake.log[0], consumes=snakemake.input, end_process=True):
    run(
        weights=snakemake.params.weights,
        cache_dir=Path(snakemake.params.cache_dir),
        offline=snakemake.params.offline,
        backend=snakemake.params.backend,
        out_dir=Path(snakemake.output.checkpoint),
        manifest_path=Path(snakemake.output.manifest),
        summary_path=Path(snakemake.output.summary),
    )
