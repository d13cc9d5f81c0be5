from pathlib import Path

from qwen3_pilot.corpus import fetch_corpus_stage
from qwen3_pilot.stagelog import stage_log

with stage_log(snakemake.log[0], consumes=snakemake.input):
    fetch_corpus_stage(
        data=snakemake.params.data,
        backend=snakemake.params.backend,
        out_dir=Path(snakemake.output.corpus),
        summary_path=Path(snakemake.output.summary),
    )
