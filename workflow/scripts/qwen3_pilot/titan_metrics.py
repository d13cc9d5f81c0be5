"""torchtitan's MetricsProcessor with a JSON-lines logger and the backend's MFU peak.

Each logged step becomes one line of <dump_folder>/metrics.jsonl with torchtitan's own metric names
(loss_metrics/global_avg_loss, grad_norm, throughput(tps), tflops, mfu(%), memory/max_active(GiB),
time_metrics/end_to_end(s) ...), written by rank 0 and flushed per step.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

from torchtitan.components.metrics import BaseLogger, LoggerContainer, MetricsProcessor

METRICS_FILE = "metrics.jsonl"


class JsonlLogger(BaseLogger):
    def __init__(self, path: str):
        self.handle = open(path, "a", buffering=1)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        record: dict[str, Any] = {"step": step}
        for key, value in metrics.items():
            number = float(value) if hasattr(value, "__float__") else value
            # JSON has no NaN/inf: keep them visible as strings so the stage can name the step.
            record[key] = repr(number) if isinstance(number, float) and not math.isfinite(number) else number
        self.handle.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self.handle.close()


class JsonlMetricsProcessor(MetricsProcessor):
    @dataclass(kw_only=True, slots=True)
    class Config(MetricsProcessor.Config):
        peak_flops: float = 0.0
        """Peak FLOPS per rank for MFU; 0 keeps torchtitan's get_peak_flops(device name)."""

    def __init__(self, config: Config, *, dump_folder: str = "./outputs", **kwargs):
        super().__init__(config, dump_folder=dump_folder, **kwargs)
        if config.peak_flops > 0:
            self.gpu_peak_flops = config.peak_flops
        if int(os.environ.get("RANK", "0")) == 0:
            os.makedirs(dump_folder, exist_ok=True)
            if not isinstance(self.logger, LoggerContainer):
                container = LoggerContainer()
                container.add_logger(self.logger)
                self.logger = container
            self.logger.add_logger(JsonlLogger(os.path.join(dump_folder, METRICS_FILE)))
