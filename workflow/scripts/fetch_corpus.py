from pathlib import Path

from qwen3_pilot.stagelog import stage_log
from qwen3_pilot.stages.fetch_corpus import run

with stage_log(snakemake.log[0], consumes=snakemake.input, end_process=True):
    run(
        data=snakemake.params.data,
        backend=snakemake.params.backend,
        out_dir=Path(snakemake.output.corpus),
        summary_path=Path(snakemake.output.summary),
    )
