from pathlib import Path

from qwen3_pilot.stagelog import stage_log
from qwen3_pilot.stages.export_reload import run
from qwen3_pilot.training import recorded_export_dir

with stage_log(snakemake.log[0], consumes=snakemake.input, end_process=True):
    run(
        exports={
            recipe: recorded_export_dir(Path(snakemake.input[f"{recipe}_summary"])) for recipe in ("hf", "native")
        },
        checkpoint_dir=Path(snakemake.input.checkpoint),
        out_root=Path(snakemake.output.summary).parent,
        settings=snakemake.params.settings,
        seed=snakemake.params.seed,
        backend=snakemake.params.backend,
        summary_path=Path(snakemake.output.summary),
    )
