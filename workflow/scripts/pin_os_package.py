from pathlib import Path

from qwen3_pilot.stage_run import StageRun
from qwen3_pilot.stages.pin_env import run_os_package

with StageRun.of_job(snakemake) as stage_run:
    run_os_package(snakemake.wildcards.package, snakemake.params.pinned, Path(snakemake.output[0]))
