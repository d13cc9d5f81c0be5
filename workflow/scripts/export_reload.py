from pathlib import Path

from qwen3_pilot.export_reload import export_reload_stage
from qwen3_pilot.stagelog import stage_log

with stage_log(snakemake.log[0]):
    step = f"step-{snakemake.params.steps}"
    export_reload_stage(
        exports={recipe: Path(snakemake.input[recipe]) / "checkpoint" / step for recipe in ("hf", "native")},
        checkpoint_dir=Path(snakemake.input.checkpoint),
        out_root=Path(snakemake.output.summary).parent,
        settings=snakemake.params.settings,
        seed=snakemake.params.seed,
        backend=snakemake.params.backend,
        summary_path=Path(snakemake.output.summary),
    )
