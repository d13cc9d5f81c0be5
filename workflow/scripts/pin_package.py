from pathlib import Path

from qwen3_pilot.pins import pin_package_stage
from qwen3_pilot.stagelog import stage_log

with stage_log(snakemake.log[0], consumes=snakemake.input):
    pin_package_stage(snakemake.wildcards.package, snakemake.params.pinned, Path(snakemake.output[0]))
