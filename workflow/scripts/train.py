from pathlib import Path

from qwen3_pilot.stage_run import StageRun
from qwen3_pilot.stages.train import run

with StageRun.of_job(snakemake) as stage_run:
    run(
        stage=stage_run.stage,
        backend_config=snakemake.params.backend,
        dataset=snakemake.params.dataset,
        training=snakemake.params.training,
        # train_hf has no kernels to replace (its RoPE lives inside transformers' model), so no plain run.
        kernels=snakemake.params.kernels,
        cache_root=stage_run.cache_root,
        checkpoint_dir=Path(snakemake.input.checkpoint),
        corpus_dir=Path(snakemake.input.corpus),
        ranks_record=Path(snakemake.input.ranks),
        recipe_path=Path(snakemake.output.recipe),
        run_dir=Path(snakemake.output.run),
        plain_dir=Path(snakemake.output.plain),
        control_dir=Path(snakemake.output.control),
        repeat_dir=Path(snakemake.output.repeat),
        repeat_steps=snakemake.params.repeat_steps,
        measured_path=Path(snakemake.output.measured),
        log_path=stage_run.log_path,
    )
