from pathlib import Path

from qwen3_pilot.stagelog import stage_log
from qwen3_pilot.stages.pin_env import run

with stage_log(snakemake.log[0], consumes=snakemake.input, end_process=True):
    run(
        stamps=list(snakemake.input.stamps),
        backend=snakemake.params.backend,
        pins_file=snakemake.params.pins_file,
        lock_file=Path(snakemake.input.lock[0]) if snakemake.input.lock else None,
        cache_root=snakemake.params.cache_root,
        out=Path(snakemake.output.summary),
    )
