"""AWS's nccom-test as verify_ranks runs it on neuron: its command from the guide's options, and its JSON report (the
guide's recorded example, workflow/resources/neuron/) read into verify_ranks' rows."""

from __future__ import annotations

import json
import stat

import pytest

from qwen3_pilot.backends.neuron.nccom_test import GIB, MIB, command, rows_from_report, run_nccom_test, size_runs
from qwen3_pilot.paths import WORKFLOW
from qwen3_pilot.ranks import BUS_FACTORS

RECORDED = WORKFLOW / "resources" / "neuron" / "nccom-test.allg-32ranks.json"


def test_geometric_sizes_are_one_invocation_by_their_factor_and_others_one_per_size():
    assert size_runs([1, 4, 16, 64, 256, 1024]) == [[MIB * 4**i for i in range(6)]]
    assert size_runs([1, 2, 3]) == [[MIB], [2 * MIB], [3 * MIB]]
    assert size_runs([32]) == [[32 * MIB]]


def test_the_command_uses_the_guides_options_with_a_correctness_check_and_a_json_report(tmp_path):
    argv = command("all_to_all", 64, [MIB, 4 * MIB, 16 * MIB], warmup=5, iterations=20, json_path=tmp_path / "r.json")
    assert argv == ["nccom-test", "--nworkers", "64", "--minbytes", str(MIB), "--maxbytes", str(16 * MIB),
                    "--stepfactor", "4", "--datatype", "fp32", "--iters", "20", "--warmup_iters", "5", "--check",
                    "all_ones", "--non-interactive", "--report-to-json-file", str(tmp_path / "r.json"), "alltoall"]
    assert "--stepfactor" not in command("all_reduce", 2, [MIB], warmup=1, iterations=3, json_path=tmp_path / "s")


def test_the_recorded_report_reads_as_rows_in_gb_per_second_from_gib():
    report = json.loads(RECORDED.read_text())
    rows = rows_from_report("all_gather", report)
    assert [r["size_mib"] for r in rows] == [1024 / MIB, 8192 / MIB, 65536 / MIB, 524288 / MIB]
    assert rows[-1]["time_us"] == 23.11
    assert rows[-1]["busbw_gbps"] == pytest.approx(21.97975251876395 * GIB / 1e9)  # 23.6 GB/s = 21.98 GiB/s
    # nccom-test's bus bandwidth is nccl-tests' (n-1)/n for a 32-rank all-gather, as verify_ranks' own rows compute it.
    for result in report["results"]:
        assert result["busbw(GB/s)"] / result["algbw(GB/s)"] == pytest.approx(BUS_FACTORS["all_gather"](32))


def test_without_nccom_test_the_record_says_so_and_a_failing_run_is_recorded_not_raised(tmp_path):
    settings = {"sizes_mib": [1], "warmup": 1, "iterations": 2}
    assert run_nccom_test(64, settings, tmp_path, tmp_path / "log", None, {}) == {
        "ran": False, "why": "nccom-test is not on PATH (aws-neuronx-tools installs it)"}
    failing = tmp_path / "nccom-test"
    failing.write_text("#!/bin/sh\necho 'Neuron DKMS Driver is not running!'\nexit 1\n")
    failing.chmod(failing.stat().st_mode | stat.S_IEXEC)
    record = run_nccom_test(64, settings, tmp_path / "out", tmp_path / "log", str(failing), {})
    assert record["ran"] and record["bandwidth"] == [] and len(record["failures"]) == 4
    assert "alltoall: exit 1" in record["failures"][-1]
    assert "Neuron DKMS Driver is not running!" in (tmp_path / "log").read_text()


def test_a_run_that_writes_its_report_gives_rows_per_collective(tmp_path):
    # A stand-in that writes the guide's recorded report wherever --report-to-json-file points.
    stand_in = tmp_path / "nccom-test"
    stand_in.write_text("#!/bin/sh\nwhile [ $# -gt 0 ]; do\n"
                        f"  [ \"$1\" = --report-to-json-file ] && cp {RECORDED} \"$2\"\n  shift\ndone\n")
    stand_in.chmod(stand_in.stat().st_mode | stat.S_IEXEC)
    record = run_nccom_test(32, {"sizes_mib": [1], "warmup": 1, "iterations": 2}, tmp_path / "out", tmp_path / "log",
                            str(stand_in), {})
    assert record["failures"] == [] and len(record["bandwidth"]) == 16
    assert {r["collective"] for r in record["bandwidth"]} == set(BUS_FACTORS)


def test_the_neuron_backend_runs_it_on_one_instance_only(tmp_path):
    from conftest import backend_config

    from qwen3_pilot.backends import make_backend

    two = make_backend(backend_config("neuron", 64, nodes=2), str(tmp_path))
    assert two.vendor_collectives({"sizes_mib": [1], "warmup": 1, "iterations": 2}, tmp_path, tmp_path / "log") == {
        "ran": False, "why": "nodes = 2: nccom-test across instances needs its MPI or SLURM mode, which verify_ranks "
                             "does not drive"}
    assert make_backend(backend_config("cpu"), str(tmp_path)).vendor_collectives is None
