from pathlib import Path

from qwen3_pilot.stage_run import StageRun
from qwen3_pilot.stages.export_reload import RECIPES, run
from qwen3_pilot.training import recorded_export_dir

with StageRun.of_job(snakemake) as stage_run:
    run(
        exports={recipe: recorded_export_dir(Path(snakemake.input[f"{recipe}_summary"])) for recipe in RECIPES},
        checkpoint_dir=Path(snakemake.input.checkpoint),
        out_root=Path(snakemake.output.measured).parent,
        settings=snakemake.params.settings,
        seed=snakemake.params.seed,
        backend=snakemake.params.backend,
        measured_path=Path(snakemake.output.measured),
    )
