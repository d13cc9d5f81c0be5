from pathlib import Path

from qwen3_pilot.stage_run import StageRun
from qwen3_pilot.stages.compare_recipes import run

with StageRun.of_job(snakemake) as stage_run:
    run(
        hf_summary=Path(snakemake.input.train_hf),
        native_summary=Path(snakemake.input.train_native),
        tolerance=snakemake.params.tolerance,
        backend=snakemake.params.backend,
        summary_path=Path(snakemake.output.summary),
    )
