from pathlib import Path

from qwen3_pilot.report import build_report
from qwen3_pilot.stagelog import stage_log

with stage_log(snakemake.log[0], consumes=snakemake.input):
    # A stage that does not run on this backend (fixture_checkpoint with hub weights) has an empty input.
    named = {name: snakemake.input[name] for name in snakemake.input.keys()}
    summaries = {name: Path(value if isinstance(value, str) else value[0]) for name, value in named.items() if value}
    build_report(
        summaries=summaries,
        config=snakemake.params.config,
        config_digest=snakemake.params.config_digest,
        workflow_dir=Path(snakemake.scriptdir),
        html_path=Path(snakemake.output.html),
        json_path=Path(snakemake.output.json),
    )
