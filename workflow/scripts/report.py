from pathlib import Path

from qwen3_pilot.report import build_report
from qwen3_pilot.stagelog import stage_log

with stage_log(snakemake.log[0]):
    summaries = {name: Path(path) for name, path in snakemake.input.items() if path}
    build_report(
        summaries=summaries,
        config=snakemake.params.config,
        config_digest=snakemake.params.config_digest,
        workflow_dir=Path(snakemake.scriptdir),
        html_path=Path(snakemake.output.html),
        json_path=Path(snakemake.output.json),
    )
