from pathlib import Path

from qwen3_pilot.stage_run import StageRun
from qwen3_pilot.stages.report import run

with StageRun.of_job(snakemake) as stage_run:
    run(
        summaries={stage: Path(snakemake.input[stage]) for stage in snakemake.input.keys() if stage != "page"},
        config=snakemake.params.config,
        config_digest=snakemake.params.config_digest,
        workflow_dir=Path(snakemake.scriptdir),
        html_path=Path(snakemake.output.html),
        json_path=Path(snakemake.output.json),
    )
