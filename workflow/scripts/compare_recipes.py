from pathlib import Path

from qwen3_pilot.stagelog import stage_log
from qwen3_pilot.stages.compare_recipes import run

with stage_log(snakemake.log[0], consumes=snakemake.input, end_process=True):
    run(
        hf_summary=Path(snakemake.input.train_hf),
        native_summary=Path(snakemake.input.train_native),
        tolerance=snakemake.params.tolerance,
        backend=snakemake.params.backend,
        summary_path=Path(snakemake.output.summary),
    )
