from pathlib import Path

from qwen3_pilot.stage_run import StageRun

with StageRun.of_job(snakemake) as stage_run:
    # Imported inside the StageRun: it fixes the compile caches' folders before torch._dynamo is imported.
    from qwen3_pilot.stages.fail_fast import run

    run(
        backend_config=snakemake.params.backend,
        settings=snakemake.params.settings,
        training=snakemake.params.training,
        kernels=snakemake.params.kernels,
        moe=snakemake.params.moe,
        dataset=snakemake.params.dataset,
        cache_root=stage_run.cache_root,
        checkpoint_dir=Path(snakemake.input.checkpoint),
        corpus_dir=Path(snakemake.input.corpus),
        work=Path(snakemake.output.work),
        passed_path=Path(snakemake.output.passed),
        summary_path=Path(snakemake.output.summary),
        log_path=stage_run.log_path,
        log=stage_run.log.info,
    )
