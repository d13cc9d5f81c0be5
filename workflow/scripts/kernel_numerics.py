from qwen3_pilot.stage_run import StageRun

with StageRun.of_job(snakemake) as stage_run:
    # Imported inside the log: the stage fixes inductor's cache folder before torch._dynamo is imported.
    from qwen3_pilot.stages.kernel_numerics import run

    run(
        backend_config=snakemake.params.backend,
        settings=snakemake.params.settings,
        cache_root=stage_run.cache_root,
        results_path=snakemake.output.results,
        summary_path=snakemake.output.summary,
        log=stage_run.log.info,
    )
