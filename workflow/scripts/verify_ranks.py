from pathlib import Path

from qwen3_pilot.config import CACHE_ROOT
from qwen3_pilot.stagelog import stage_log
from qwen3_pilot.stages.verify_ranks import run

with stage_log(snakemake.log[0], consumes=snakemake.input, end_process=True):
    run(
        backend_config=snakemake.params.backend,
        plan=snakemake.params.plan,
        cache_root=CACHE_ROOT,  # the project's library caches (config.CACHE_ROOT)
        ranks_dir=Path(snakemake.output.ranks),
        plan_path=Path(snakemake.output.plan),
        summary_path=Path(snakemake.output.summary),
        log_path=Path(snakemake.log[0]),
    )
