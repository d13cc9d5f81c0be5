"""Stage report: results/report.json and results/report.html from the stage summaries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..pilot_report import collect_stages, write_report
from . import skipped_stages


def run(
    *,
    summaries: dict[str, Path],
    config: dict[str, Any],
    config_digest: str,
    workflow_dir: Path,
    html_path: Path,
    json_path: Path,
) -> dict[str, Any]:
    skipped = skipped_stages(config)
    stages = collect_stages(summaries, config, skipped)
    return write_report(stages, config=config, config_digest=config_digest, workflow_dir=workflow_dir,
                        html_path=html_path, json_path=json_path, optional=set(skipped))
