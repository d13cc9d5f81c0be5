"""`python -m qwen3_pilot.tools.preflight` (make preflight): the trn2 configuration checked without a trn2."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ...paths import PROJECT, RunFolder
from . import DEFAULT_MODEL_CONFIGS
from .fork import UPSTREAM_TORCHTITAN
from .run import preflight, print_summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="trn2 preflight: the trn2 configuration checked without a trn2")
    parser.add_argument("--configfile", type=Path, nargs="+", default=[PROJECT / "config" / "trn2.yaml"])
    parser.add_argument("--model-configs", type=Path, default=DEFAULT_MODEL_CONFIGS,
                        help="folder with the published <model>.config.json files")
    parser.add_argument("--out", type=Path, default=RunFolder(PROJECT).results / "preflight")
    parser.add_argument("--fork", help="a TorchTitan Neuron clone (path or URL) to check: its base, its API and "
                                       "the recipes' launches on its torchtitan")
    parser.add_argument("--fork-ref", help="the fork's branch, tag or commit (default: the SDK release file's ref)")
    parser.add_argument("--upstream", default=UPSTREAM_TORCHTITAN, help="upstream torchtitan (path or URL)")
    parser.add_argument("--cpu-run", type=Path, default=PROJECT,
                        help="a finished cpu run whose recipe launches the fork's torchtitan trains (default: here)")
    args = parser.parse_args(argv)
    report = preflight(args.configfile, args.model_configs, args.out, fork=args.fork, fork_ref=args.fork_ref,
                       upstream=args.upstream, cpu_run=args.cpu_run.resolve())
    print_summary(report)
    print(f"report: {args.out / 'preflight.html'}")
    return 0 if report["status"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
