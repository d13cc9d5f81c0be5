from pathlib import Path

from qwen3_pilot.stagelog import stage_log
from qwen3_pilot.stages.judge_training import run

with stage_log(snakemake.log[0], consumes=snakemake.input, end_process=True):
    run(
        stage=snakemake.wildcards.stage,
        judging=snakemake.params.judging,
        measured_path=Path(snakemake.input.measured),
        summary_path=Path(snakemake.output.summary),
    )
