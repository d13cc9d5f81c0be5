from pathlib import Path

from qwen3_pilot.config import CACHE_ROOT
from qwen3_pilot.stagelog import stage_log
from qwen3_pilot.stages.pin_env import run

with stage_log(snakemake.log[0], consumes=snakemake.input, end_process=True):
    run(
        stamps=list(snakemake.input.stamps),
        backend=snakemake.params.backend,
        pins_file=snakemake.params.pins_file,
        lock_file=Path(snakemake.input.lock[0]) if snakemake.input.lock else None,
        cache_root=CACHE_ROOT,  # the project's library caches (config.CACHE_ROOT)
        out=Path(snakemake.output.summary),
    )
