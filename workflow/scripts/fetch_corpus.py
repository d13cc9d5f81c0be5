from pathlib import Path

from qwen3_pilot.stage_run import StageRun
from qwen3_pilot.stages.fetch_corpus import run

with StageRun.of_job(snakemake) as stage_run:
    run(
        data=snakemake.params.data,
        backend=snakemake.params.backend,
        out_dir=Path(snakemake.output.corpus),
        heldout_dir=Path(snakemake.output.heldout),
        summary_path=Path(snakemake.output.summary),
    )
