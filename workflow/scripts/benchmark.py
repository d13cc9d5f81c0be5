from pathlib import Path

from qwen3_pilot.config import CACHE_ROOT
from qwen3_pilot.stagelog import stage_log
from qwen3_pilot.stages.benchmark import run

with stage_log(snakemake.log[0], consumes=snakemake.input, end_process=True):
    run(
        backend_config=snakemake.params.backend,
        dataset=snakemake.params.dataset,
        training=snakemake.params.training,
        moe=snakemake.params.moe,
        kernels=snakemake.params.kernels,
        settings=snakemake.params.settings,
        cache_root=CACHE_ROOT,  # the project's library caches (config.CACHE_ROOT)
        checkpoint_dir=Path(snakemake.input.checkpoint),
        corpus_dir=Path(snakemake.input.corpus),
        ranks_summary=Path(snakemake.input.ranks),
        out_dir=Path(snakemake.output.runs),
        summary_path=Path(snakemake.output.summary),
        log_path=Path(snakemake.log[0]),
    )
