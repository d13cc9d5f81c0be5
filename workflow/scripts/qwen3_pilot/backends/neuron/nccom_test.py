"""AWS's own collective benchmark, nccom-test, run by verify_ranks on a Neuron instance for the sizes and collectives
the torch.distributed ranks timed, and its JSON report read into the same rows (torch-free).

AWS's NCCOM-TEST User Guide (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/tools/neuron-sys-tools/
nccom-test.html) is the source of every option and field here: `nccom-test -r <ranks> <operation>`, sizes from
`--minbytes` to `--maxbytes` by `--stepfactor`, `--iters` timed and `--warmup_iters` untimed operations, `--datatype`,
`--check all_ones` (every output compared with the known value), and `--report-to-json-file`, whose `results` hold
`size(B)`, `time:avg(us)`, `algbw(GB/s)` and `busbw(GB/s)` per size. Its "GB/s" are gibibytes per second (the guide's
column descriptions); the rows here are in 10^9 bytes per second, as the torch.distributed ones are.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

MIB = 2**20
GIB = 2**30
# torch.distributed's collective names (ranks.BUS_FACTORS) -> nccom-test's operation argument.
OPERATIONS = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
              "all_to_all": "alltoall"}


def size_runs(sizes_mib: list[float]) -> list[list[int]]:
    """The sizes in bytes, grouped into nccom-test invocations: one for all of them where they step by one whole
    factor (the trn2 config's 1, 4, 16 ... 1024 MiB), one per size otherwise (nccom-test steps by a factor or a
    fixed increment only)."""
    sizes = sorted(int(size * MIB) for size in sizes_mib)
    if len(sizes) > 1:
        factor = sizes[1] // sizes[0]
        if factor >= 2 and all(later == earlier * factor for earlier, later in zip(sizes, sizes[1:], strict=False)):
            return [sizes]
    return [[size] for size in sizes]


def command(collective: str, ranks: int, sizes: list[int], *, warmup: int, iterations: int,
            json_path: Path) -> list[str]:
    """One nccom-test invocation: `collective` over `ranks` ranks on this instance, float32 as the ranks use, each
    result checked (all_ones), the results written to `json_path`."""
    steps = ["--stepfactor", str(sizes[1] // sizes[0])] if len(sizes) > 1 else []
    return ["nccom-test", "--nworkers", str(ranks), "--minbytes", str(sizes[0]), "--maxbytes", str(sizes[-1]),
            *steps, "--datatype", "fp32", "--iters", str(iterations), "--warmup_iters", str(warmup),
            "--check", "all_ones", "--non-interactive", "--report-to-json-file", str(json_path),
            OPERATIONS[collective]]


def rows_from_report(collective: str, report: dict[str, Any]) -> list[dict[str, Any]]:
    """nccom-test's JSON results as verify_ranks' bandwidth rows: size in MiB, mean time in microseconds, algorithm
    and bus bandwidth in GB/s (10^9 B/s, from nccom-test's GiB/s)."""
    rows = []
    for result in report["results"]:
        time_key = "time:avg(us)" if "time:avg(us)" in result else "time(us)"
        rows.append({"collective": collective, "size_mib": result["size(B)"] / MIB, "time_us": float(result[time_key]),
                     "algbw_gbps": result["algbw(GB/s)"] * GIB / 1e9, "busbw_gbps": result["busbw(GB/s)"] * GIB / 1e9})
    return rows


def run_nccom_test(ranks: int, collectives: dict[str, Any], out_dir: Path, log_path: Path,
                   executable: str | None, env: dict[str, str]) -> dict[str, Any]:
    """nccom-test for every collective and size verify_ranks timed, in `env` (the device processes' environment:
    its LNC among it); `executable`: its path, None when it is not installed. The record says what ran and what
    each invocation gave; a failed invocation is recorded with its exit status (its output is in the stage log), not
    raised: this is the vendor's figure beside the stage's own, not the stage's check."""
    if executable is None:
        return {"ran": False, "why": "nccom-test is not on PATH (aws-neuronx-tools installs it)"}
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, failures, commands = [], [], []
    for collective in OPERATIONS:
        for sizes in size_runs(collectives["sizes_mib"]):
            json_path = out_dir / f"{collective}-{sizes[0]}.json"
            argv = command(collective, ranks, sizes, warmup=collectives["warmup"],
                           iterations=collectives["iterations"], json_path=json_path)
            argv[0] = executable
            commands.append(argv)
            with open(log_path, "a") as log:
                log.write(f"$ {' '.join(argv)}\n")
                result = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
            if result.returncode != 0 or not json_path.exists():
                failures.append(f"{' '.join(argv)}: exit {result.returncode} (see {log_path})")
                continue
            rows += rows_from_report(collective, json.loads(json_path.read_text()))
    return {"ran": True, "commands": commands, "bandwidth": rows, "failures": failures,
            "units": "GB/s = 10^9 B/s (nccom-test prints GiB/s; converted)"}
