from pathlib import Path

from qwen3_pilot.stagelog import stage_log
from qwen3_pilot.stages.fixture_checkpoint import run

with stage_log(snakemake.log[0], consumes=snakemake.input, end_process=True):
    run(
        corpus_dir=Path(snakemake.input.corpus),
        fixture=snakemake.params.fixture,
        repo_id=snakemake.params.repo_id,
        revision=snakemake.params.revision,
        backend=snakemake.params.backend,
        out_dir=Path(snakemake.output.fixture),
        summary_path=Path(snakemake.output.summary),
    )
