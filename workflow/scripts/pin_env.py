from pathlib import Path

from qwen3_pilot.stage_run import StageRun
from qwen3_pilot.stages.pin_env import run

with StageRun.of_job(snakemake) as stage_run:
    run(
        stamps=list(snakemake.input.stamps),
        backend=snakemake.params.backend,
        pins_file=snakemake.params.pins_file,
        lock_file=Path(snakemake.input.lock[0]) if snakemake.input.lock else None,
        cache_root=stage_run.cache_root,
        out=Path(snakemake.output.summary),
        sdk_release=snakemake.params.sdk_release,
    )
