from pathlib import Path

from qwen3_pilot.stage_run import StageRun
from qwen3_pilot.stages.archive import run_read_back

with StageRun.of_job(snakemake) as stage_run:
    run_read_back(
        copy_record=Path(snakemake.input.record),
        manifest_path=Path(snakemake.output.manifest),
        summary_path=Path(snakemake.output.summary),
    )
