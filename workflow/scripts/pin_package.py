from pathlib import Path

from qwen3_pilot.stagelog import stage_log
from qwen3_pilot.stages.pin_env import run_package

with stage_log(snakemake.log[0], consumes=snakemake.input, end_process=True):
    run_package(snakemake.wildcards.package, snakemake.params.pinned, Path(snakemake.output[0]))
