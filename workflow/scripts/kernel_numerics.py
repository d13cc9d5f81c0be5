from pathlib import Path

from qwen3_pilot.stage_run import StageRun

with StageRun.of_job(snakemake) as stage_run:
    # Imported inside the StageRun: the stage fixes inductor's cache folder before torch._dynamo is imported.
    from qwen3_pilot.stages.kernel_numerics import run

    run(
        backend_config=snakemake.params.backend,
        settings=snakemake.params.settings,
        cache_root=stage_run.cache_root,
        measured_path=Path(snakemake.output.measured),
        log=stage_run.log.info,
    )
