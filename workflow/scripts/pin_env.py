from pathlib import Path

from qwen3_pilot.pins import pin_env_stage
from qwen3_pilot.stagelog import stage_log

with stage_log(snakemake.log[0], consumes=snakemake.input):
    pin_env_stage(
        stamps=list(snakemake.input.stamps),
        backend=snakemake.params.backend,
        pins_file=snakemake.params.pins_file,
        cache_root=snakemake.params.cache_root,
        out=Path(snakemake.output.summary),
    )
