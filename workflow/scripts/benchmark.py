from pathlib import Path

from qwen3_pilot.stage_run import StageRun
from qwen3_pilot.stages.benchmark import run

with StageRun.of_job(snakemake) as stage_run:
    run(
        backend_config=snakemake.params.backend,
        dataset=snakemake.params.dataset,
        training=snakemake.params.training,
        moe=snakemake.params.moe,
        kernels=snakemake.params.kernels,
        settings=snakemake.params.settings,
        cache_root=stage_run.cache_root,
        checkpoint_dir=Path(snakemake.input.checkpoint),
        corpus_dir=Path(snakemake.input.corpus),
        ranks_record=Path(snakemake.input.ranks),
        out_dir=Path(snakemake.output.runs),
        measured_path=Path(snakemake.output.measured),
        log_path=stage_run.log_path,
    )
