from qwen3_pilot.stagelog import stage_log

with stage_log(snakemake.log[0], consumes=snakemake.input, end_process=True) as log:
    # Imported inside the log: the stage fixes inductor's cache folder before torch._dynamo is imported.
    from qwen3_pilot.stages.kernel_numerics import run

    run(
        backend_config=snakemake.params.backend,
        settings=snakemake.params.settings,
        cache_root=snakemake.params.cache_root,
        results_path=snakemake.output.results,
        summary_path=snakemake.output.summary,
        log=log.info,
    )
