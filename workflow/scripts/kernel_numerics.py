from qwen3_pilot.config import CACHE_ROOT
from qwen3_pilot.stagelog import stage_log

with stage_log(snakemake.log[0], consumes=snakemake.input, end_process=True) as log:
    # Imported inside the log: the stage fixes inductor's cache folder before torch._dynamo is imported.
    from qwen3_pilot.stages.kernel_numerics import run

    run(
        backend_config=snakemake.params.backend,
        settings=snakemake.params.settings,
        cache_root=CACHE_ROOT,  # the project's library caches (config.CACHE_ROOT)
        results_path=snakemake.output.results,
        summary_path=snakemake.output.summary,
        log=log.info,
    )
