from pathlib import Path

from qwen3_pilot.stagelog import stage_log
from qwen3_pilot.stages.archive import run_read_back

with stage_log(snakemake.log[0], consumes=snakemake.input, end_process=True):
    run_read_back(
        copy_record=Path(snakemake.input.record),
        manifest_path=Path(snakemake.output.manifest),
        summary_path=Path(snakemake.output.summary),
    )
