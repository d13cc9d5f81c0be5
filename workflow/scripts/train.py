from pathlib import Path

from qwen3_pilot.config import CACHE_ROOT
from qwen3_pilot.stagelog import stage_log
from qwen3_pilot.stages.train import run

with stage_log(snakemake.log[0], consumes=snakemake.input, end_process=True):
    run(
        stage=snakemake.wildcards.stage,
        backend_config=snakemake.params.backend,
        dataset=snakemake.params.dataset,
        training=snakemake.params.training,
        # train_hf has no kernels to replace (its RoPE lives inside transformers' model), so no plain run.
        kernels=snakemake.params.kernels,
        cache_root=CACHE_ROOT,  # the project's library caches (config.CACHE_ROOT)
        checkpoint_dir=Path(snakemake.input.checkpoint),
        corpus_dir=Path(snakemake.input.corpus),
        ranks_summary=Path(snakemake.input.ranks),
        recipe_path=Path(snakemake.output.recipe),
        run_dir=Path(snakemake.output.run),
        plain_dir=Path(snakemake.output.plain),
        control_dir=Path(snakemake.output.control),
        measured_path=Path(snakemake.output.measured),
        log_path=Path(snakemake.log[0]),
    )
