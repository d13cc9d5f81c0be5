"""How much wall time a training stage adds over launching the same torchtitan config by hand; for the
benchmark stage (`--stage benchmark`), the share of its time spent outside the trainer runs it launches; with
`--parse`, how long Snakemake takes to parse the workflow and plan (`snakemake -n`).

    .venv/bin/python -m qwen3_pilot.tools.overhead [--stage train_native | --parse] [--repeats 1] [-- SNAKEMAKE ARGS]

Reruns the stage under Snakemake (`--force` on its summary), takes the job's wall time from Snakemake's benchmark
file, then runs the two torchrun commands the stage recorded (`run/launch.json`, `control/launch.json`)
by hand, with the same environment, into a scratch folder. The overhead is the stage's time beyond
those two launches (median over the repeats); it also prints how much of the stage's time is spent outside
its own launches. A benchmark, not a test: the figures vary with the machine's load.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..launch import how_it_ended
from ..paths import RunFolder
from ..trainer_run import LAUNCH_RECORD
from ..training import relaunch

LIMIT_PCT = 5.0
# `snakemake -n` on a finished run: the parse and the plan, no job (the brief's "well under 3 s").
PARSE_LIMIT_S = 3.0
# The benchmark stage: at most this share of its time outside the trainer processes it launches.
BENCHMARK_OUTSIDE_LIMIT_PCT = 2.0


def stage_wall_s(stage: str, snakemake_args: list[str], workdir: Path) -> float:
    command = [
        str(Path(sys.executable).with_name("snakemake")), "--cores", "all", f"results/{stage}/summary.json",
        "--force", *snakemake_args,  # forces the target's job: this recipe only
    ]
    subprocess.run(command, cwd=workdir, check=True, stdout=subprocess.DEVNULL)
    with open(workdir / "benchmarks" / f"{stage}.tsv") as table:
        return float(next(csv.DictReader(table, delimiter="\t"))["s"])


def recorded_launches(stage: str, workdir: Path) -> dict[str, dict]:
    """The stage's two launches as it recorded them (launch.json): command, environment, wall time."""
    return {name: json.loads(RunFolder(workdir).launch_record(stage, name).read_text())
            for name in ("run", "control")}


def by_hand_wall_s(stage: str, workdir: Path, scratch: Path) -> float:
    """The recorded launches again by hand (training.relaunch: into `scratch`, so the stage's outputs stay as
    Snakemake wrote them, through the stages' own launcher: the same process start as in the stage)."""
    total = 0.0
    for name in recorded_launches(stage, workdir):
        launch = relaunch(workdir, stage, name, scratch / name)
        if launch.returncode != 0:
            raise RuntimeError(f"{stage} {name} by hand: {how_it_ended(launch)} (log: {launch.log_path})")
        total += launch.wall_s
    return total


def parse_wall_s(snakemake_args: list[str], workdir: Path) -> float:
    """One `snakemake -n` in `workdir`: the Snakefile parsed, the config validated, the DAG planned."""
    started = time.perf_counter()
    subprocess.run([str(Path(sys.executable).with_name("snakemake")), "-n", "--quiet", *snakemake_args],
                   cwd=workdir, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def benchmark_outside_pct(workdir: Path, snakemake_args: list[str]) -> tuple[float, float, float]:
    """Reruns the benchmark stage; (its time, its launches' time, the share of its time outside them in %)."""
    stage_s = stage_wall_s("benchmark", snakemake_args, workdir)
    launches = sorted((RunFolder(workdir).results / "benchmark" / "runs").glob(f"*/*/{LAUNCH_RECORD}"))
    launches_s = sum(json.loads(path.read_text())["wall_s"] for path in launches)
    return stage_s, launches_s, 100 * (stage_s - launches_s) / stage_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", choices=["train_hf", "train_native", "benchmark"], default="train_native")
    parser.add_argument("--parse", action="store_true", help="time `snakemake -n` instead of a stage")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("snakemake_args", nargs="*", help="after --, e.g. --configfile config/trn2.yaml")
    args = parser.parse_args(argv)
    workdir = Path.cwd()
    (workdir / ".cache").mkdir(exist_ok=True)
    if args.parse:
        times = [parse_wall_s(args.snakemake_args, workdir) for _ in range(args.repeats)]
        median = statistics.median(times)
        print(f"snakemake -n: {', '.join(f'{t:.2f} s' for t in times)}; median {median:.2f} s "
              f"(limit {PARSE_LIMIT_S:g} s)")
        return 0 if median <= PARSE_LIMIT_S else 1
    if args.stage == "benchmark":
        shares = []
        for repeat in range(1, args.repeats + 1):
            stage_s, launches_s, share = benchmark_outside_pct(workdir, args.snakemake_args)
            shares.append(share)
            print(f"benchmark run {repeat}: stage {stage_s:.2f} s (Snakemake benchmark), "
                  f"its launches {launches_s:.2f} s: {share:.2f}% of the stage's time outside them")
        median = statistics.median(shares)
        print(f"median share outside the launches: {median:.2f}% (limit {BENCHMARK_OUTSIDE_LIMIT_PCT:g}%)")
        return 0 if median <= BENCHMARK_OUTSIDE_LIMIT_PCT else 1
    versus_hand, outside_launches = [], []
    for repeat in range(1, args.repeats + 1):
        stage_s = stage_wall_s(args.stage, args.snakemake_args, workdir)
        launches_s = sum(record["wall_s"] for record in recorded_launches(args.stage, workdir).values())
        with tempfile.TemporaryDirectory(dir=workdir / ".cache") as scratch:
            hand_s = by_hand_wall_s(args.stage, workdir, Path(scratch))
        versus_hand.append(100 * (stage_s - hand_s) / hand_s)
        outside_launches.append(100 * (stage_s - launches_s) / launches_s)
        print(f"{args.stage} run {repeat}: stage {stage_s:.2f} s (Snakemake benchmark), "
              f"its launches {launches_s:.2f} s, by hand {hand_s:.2f} s: {versus_hand[-1]:+.2f}% over by hand, "
              f"{outside_launches[-1]:+.2f}% outside the launches")
    median = statistics.median(versus_hand)
    print(f"median overhead over launching by hand: {median:+.2f}% (limit {LIMIT_PCT:g}%); time the stage spends "
          f"outside its launches: median {statistics.median(outside_launches):+.2f}%. Launch times vary with the "
          "machine's load: run it on a quiet machine, with several repeats.")
    return 0 if median <= LIMIT_PCT else 1


if __name__ == "__main__":
    sys.exit(main())
