from pathlib import Path

from qwen3_pilot.stagelog import stage_log
from qwen3_pilot.stages.archive import run_copy

with stage_log(snakemake.log[0], consumes=snakemake.input, end_process=True):
    run_copy(
        settings=snakemake.params.settings,
        report_json=Path(snakemake.input.json),
        record_path=Path(snakemake.output.record),
    )
