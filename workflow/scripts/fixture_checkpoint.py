from pathlib import Path

from qwen3_pilot.stage_run import StageRun
from qwen3_pilot.stages.fixture_checkpoint import run

with StageRun.of_job(snakemake) as stage_run:
    run(
        corpus_dir=Path(snakemake.input.corpus),
        fixture=snakemake.params.fixture,
        repo_id=snakemake.params.repo_id,
        revision=snakemake.params.revision,
        backend=snakemake.params.backend,
        out_dir=Path(snakemake.output.fixture),
        summary_path=Path(snakemake.output.summary),
    )
