from pathlib import Path

from qwen3_pilot.stage_run import StageRun
from qwen3_pilot.stages.moe_reduced import run

with StageRun.of_job(snakemake) as stage_run:
    run(
        backend_config=snakemake.params.backend,
        dataset=snakemake.params.dataset,
        training=snakemake.params.training,
        kernels=snakemake.params.kernels,
        moe=snakemake.params.moe,
        cache_root=stage_run.cache_root,
        checkpoint_dir=Path(snakemake.input.checkpoint),
        corpus_dir=Path(snakemake.input.corpus),
        ranks_record=Path(snakemake.input.ranks),
        recipe_path=Path(snakemake.output.recipe),
        run_dir=Path(snakemake.output.run),
        plain_dir=Path(snakemake.output.plain),
        measured_path=Path(snakemake.output.measured),
        log_path=stage_run.log_path,
    )
