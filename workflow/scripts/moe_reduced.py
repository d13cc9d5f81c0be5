from pathlib import Path

from qwen3_pilot.config import CACHE_ROOT
from qwen3_pilot.stagelog import stage_log
from qwen3_pilot.stages.moe_reduced import run

with stage_log(snakemake.log[0], consumes=snakemake.input, end_process=True):
    run(
        backend_config=snakemake.params.backend,
        dataset=snakemake.params.dataset,
        training=snakemake.params.training,
        kernels=snakemake.params.kernels,
        moe=snakemake.params.moe,
        cache_root=CACHE_ROOT,  # the project's library caches (config.CACHE_ROOT)
        checkpoint_dir=Path(snakemake.input.checkpoint),
        corpus_dir=Path(snakemake.input.corpus),
        ranks_summary=Path(snakemake.input.ranks),
        recipe_path=Path(snakemake.output.recipe),
        run_dir=Path(snakemake.output.run),
        plain_dir=Path(snakemake.output.plain),
        measured_path=Path(snakemake.output.measured),
        log_path=Path(snakemake.log[0]),
    )
