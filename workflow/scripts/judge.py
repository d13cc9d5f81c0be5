from pathlib import Path

from qwen3_pilot.stage_run import StageRun
from qwen3_pilot.stages.judge import run

with StageRun.of_job(snakemake) as stage_run:
    run(
        stage=stage_run.stage,
        judging=snakemake.params.judging,
        measured_path=Path(snakemake.input.measured),
        summary_path=Path(snakemake.output.summary),
    )
