from pathlib import Path

from qwen3_pilot.stage_run import StageRun
from qwen3_pilot.stages.archive import run_copy

with StageRun.of_job(snakemake) as stage_run:
    run_copy(
        settings=snakemake.params.settings,
        report_json=Path(snakemake.input.json),
        record_path=Path(snakemake.output.record),
    )
