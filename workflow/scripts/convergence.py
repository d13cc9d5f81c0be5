from pathlib import Path

from qwen3_pilot.stage_run import StageRun
from qwen3_pilot.stages.convergence import run

with StageRun.of_job(snakemake) as stage_run:
    run(
        backend_config=snakemake.params.backend,
        dataset=snakemake.params.dataset,
        training=snakemake.params.training,
        convergence=snakemake.params.convergence,
        kernels=snakemake.params.kernels,
        cache_root=stage_run.cache_root,
        checkpoint_dir=Path(snakemake.input.checkpoint),
        corpus_dir=Path(snakemake.input.corpus),
        heldout_dir=Path(snakemake.input.heldout),
        ranks_record=Path(snakemake.input.ranks),
        recipe_path=Path(snakemake.output.recipe),
        run_dir=Path(snakemake.output.run),
        measured_path=Path(snakemake.output.measured),
        log_path=stage_run.log_path,
    )
