"""make verify and make signoff: an artifact changed after its stage recorded it is named with both digests,
and a sign-off whose report.json changed since is flagged."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from qwen3_pilot.artifacts import sha256_file
from qwen3_pilot.audit import SignoffError, main, read_signoffs, record_written_report, signoff, verify


@pytest.fixture
def workspace(tmp_path):
    """A report.json in results/ listing one artifact with its sha256, as the stages record them."""
    (tmp_path / "results" / "stage").mkdir(parents=True)
    artifact = tmp_path / "results" / "stage" / "weights.bin"
    artifact.write_bytes(b"\x00\x01\x02\x03")
    report = {
        "status": "pass",
        "backend": "cpu",
        "provenance": {"commit": "abc", "dirty": False, "started": "2026-12-03T10:00:00.000+00:00",
                       "config_digest": "d" * 64},
        "stages": [{"stage": "fetch_weights", "artifacts": [
            {"path": "results/stage/weights.bin", "bytes": 4, "sha256": sha256_file(artifact)}]}],
    }
    (tmp_path / "results" / "report.json").write_text(json.dumps(report))
    record_written_report(tmp_path / "results" / "report.json")  # as the report stage does
    return tmp_path


def test_an_untouched_run_verifies(workspace):
    lines, ok = verify(workspace / "results" / "report.json", workspace / "signoffs.jsonl")
    assert ok and lines == [f"{workspace / 'results' / 'report.json'}: 1 artifacts listed, 0 changed or missing; "
                            "report status pass"]


def test_one_changed_byte_is_named_with_both_digests(workspace, capsys):
    artifact = workspace / "results" / "stage" / "weights.bin"
    recorded = sha256_file(artifact)
    artifact.write_bytes(b"\x00\x01\x02\x04")
    report = workspace / "results" / "report.json"
    assert main(["--report", str(report), "--signoffs", str(workspace / "s.jsonl"), "verify"]) == 1
    printed = capsys.readouterr().out
    assert (f"CHANGED results/stage/weights.bin (fetch_weights): recorded sha256 {recorded}, now "
            f"{sha256_file(artifact)}") in printed
    artifact.unlink()
    lines, ok = verify(report, workspace / "s.jsonl")
    assert not ok and lines[1].endswith(", now missing")


@pytest.mark.parametrize("how", ["link", "dotdot"])
def test_an_artifact_outside_the_project_is_reported_and_never_read(workspace, tmp_path_factory, monkeypatch, how):
    """The artifact's file is replaced by a link to a file outside the workflow folder (or listed by `..`) with
    the very bytes recorded: read, it would verify; it is named, with where it points, and not read."""
    import hashlib

    outside = tmp_path_factory.mktemp("outside") / "weights.bin"
    outside.write_bytes(b"\x00\x01\x02\x03")  # the recorded content
    report = workspace / "results" / "report.json"
    if how == "link":
        listed = "results/stage/weights.bin"
        (workspace / listed).unlink()
        (workspace / listed).symlink_to(outside)
    else:
        listed = f"results/../../{outside.parent.name}/weights.bin"
        report.write_text(report.read_text().replace("results/stage/weights.bin", listed))
    read, real_file_digest, test_thread = [], hashlib.file_digest, threading.get_ident()

    def spy(handle, digest):  # every file hashed, as a real path
        if threading.get_ident() == test_thread:  # not a test body running in another thread meanwhile
            read.append(Path(handle.name).resolve())
        return real_file_digest(handle, digest)

    monkeypatch.setattr(hashlib, "file_digest", spy)
    lines, ok = verify(report, workspace / "s.jsonl")
    assert not ok
    assert lines[0] == (f"{report}: 1 artifacts listed, 0 changed or missing, 1 outside the project (not read); "
                        "report status pass")
    assert lines[1] == (f"  OUTSIDE THE PROJECT {listed} (fetch_weights) -> {outside.resolve()}: resolves outside the "
                        f"project {workspace.resolve()}; not read")
    assert outside.resolve() not in read and read  # the report's own files were hashed, the outside one never


def test_a_signoff_is_bound_to_the_report_and_an_edit_since_fails_verify(workspace):
    report, signoffs = workspace / "results" / "report.json", workspace / "signoffs" / "signoffs.jsonl"
    record = signoff(report, "A Reviewer", "approve", "pilot looks good", signoffs)
    assert record["report_sha256"] == sha256_file(report) and record["report_status"] == "pass"
    assert read_signoffs(signoffs) == [record]
    # What was signed is kept beside the sign-offs: a later run rewrites results/report.*.
    assert sha256_file(signoffs.parent / f"{record['report_sha256']}.json") == record["report_sha256"]
    assert verify(report, signoffs) == ([f"{report}: 1 artifacts listed, 0 changed or missing; report status pass",
                                         f"  signed: approve by A Reviewer on {record['date']}, this report"], True)

    report.write_text(report.read_text().replace('"pass"', '"fail"'))  # the same run's report, edited
    lines, ok = verify(report, signoffs)
    assert not ok
    assert lines[1] == (f"  EDITED SINCE SIGN-OFF approve by A Reviewer on {record['date']}: given to report.json "
                        f"sha256 {record['report_sha256']} (html missing), which is now {sha256_file(report)} "
                        "(html missing), a report the workflow never wrote")


def test_a_signoff_of_a_report_a_newer_run_replaced_is_listed_not_failed(workspace):
    report, signoffs = workspace / "results" / "report.json", workspace / "signoffs" / "signoffs.jsonl"
    record = signoff(report, "A Reviewer", "approve", "", signoffs)
    report.write_text(report.read_text().replace("2026-12-03T10:00:00", "2026-12-04T10:00:00"))  # a rerun
    record_written_report(report, signoffs_path=signoffs)
    lines, ok = verify(report, signoffs)
    assert ok and lines[1].startswith(f"  superseded: approve by A Reviewer on {record['date']}")


def test_an_edit_dressed_as_a_newer_run_is_still_an_edit(workspace):
    """The report's own fields (its start, its config digest) are what an editor would change too: only the
    ledger of reports the workflow wrote tells a newer run from an edit."""
    report, signoffs = workspace / "results" / "report.json", workspace / "signoffs" / "signoffs.jsonl"
    record = signoff(report, "A Reviewer", "approve", "", signoffs)
    report.write_text(report.read_text().replace("2026-12-03T10:00:00", "2026-12-04T10:00:00"))
    lines, ok = verify(report, signoffs)
    assert not ok and lines[1].startswith(f"  EDITED SINCE SIGN-OFF approve by A Reviewer on {record['date']}")
    assert lines[1].endswith("a report the workflow never wrote")


def test_only_a_report_the_workflow_wrote_can_be_approved(workspace):
    report, signoffs = workspace / "results" / "report.json", workspace / "signoffs" / "signoffs.jsonl"
    report.write_text(report.read_text().replace('"abc"', '"abd"'))
    with pytest.raises(SignoffError, match=r"not a report the workflow wrote .*reports_written.jsonl\): only "
                                           "DECISION=reject"):
        signoff(report, "A Reviewer", "approve", "", signoffs)
    assert signoff(report, "A Reviewer", "reject", "edited by hand", signoffs)["decision"] == "reject"


def test_a_failed_run_or_a_changed_artifact_can_only_be_rejected(workspace):
    report, signoffs = workspace / "results" / "report.json", workspace / "signoffs" / "signoffs.jsonl"
    (workspace / "results" / "stage" / "weights.bin").write_bytes(b"changed")
    with pytest.raises(SignoffError, match=r"1 artifact\(s\) changed since their stage recorded them"):
        signoff(report, "A Reviewer", "approve", "", signoffs)
    report.write_text(report.read_text().replace('"pass"', '"fail"'))
    record_written_report(report)  # as the failed-run report would be
    with pytest.raises(SignoffError, match="status fail \\(a failed run\\): only DECISION=reject"):
        signoff(report, "A Reviewer", "approve", "", signoffs)
    assert signoff(report, "A Reviewer", "reject", "the gate failed", signoffs)["decision"] == "reject"


def test_an_incomplete_report_can_only_be_rejected(workspace):
    report, signoffs = workspace / "results" / "report.json", workspace / "signoffs" / "signoffs.jsonl"
    report.write_text(report.read_text().replace('"pass"', '"incomplete"'))
    record_written_report(report)
    with pytest.raises(SignoffError, match="status incomplete \\(stages did not run\\): only DECISION=reject"):
        signoff(report, "A Reviewer", "approve", "", signoffs)
    assert signoff(report, "A Reviewer", "reject", "half a pilot", signoffs)["decision"] == "reject"


def test_a_signoff_is_bound_to_the_page_too_and_an_edit_of_report_html_alone_fails_verify(workspace):
    """The reviewer signs what the page shows: report.html edited after the sign-off, report.json untouched, is
    an edited report (a binding to report.json alone would pass it)."""
    report, signoffs = workspace / "results" / "report.json", workspace / "signoffs" / "signoffs.jsonl"
    page = report.with_suffix(".html")
    page.write_text("<html><body><p>pass</p></body></html>")
    record_written_report(report, signoffs_path=signoffs)  # the report stage writes both files, then records them
    record = signoff(report, "A Reviewer", "approve", "pilot looks good", signoffs)
    assert verify(report, signoffs)[1]
    page.write_text(page.read_text().replace("</body>", "<p>all good</p></body>"))
    assert sha256_file(report) == record["report_sha256"]
    lines, ok = verify(report, signoffs)
    assert not ok and lines[1].startswith("  EDITED SINCE SIGN-OFF approve by A Reviewer"), lines


def test_verify_lists_the_signoffs_of_runs_on_the_reports_backend_only(workspace):
    report, signoffs = workspace / "results" / "report.json", workspace / "signoffs" / "signoffs.jsonl"
    cpu = signoff(report, "A Reviewer", "approve", "the rehearsal", signoffs)
    assert cpu["backend"] == "cpu"
    # The same folder's next run on the trn2, written by the workflow.
    report.write_text(report.read_text().replace('"cpu"', '"neuron"'))
    record_written_report(report, signoffs_path=signoffs)
    lines, ok = verify(report, signoffs)
    assert ok and len(lines) == 1  # the CPU rehearsal's approval is not this run's, nor superseded by it
    trn2 = signoff(report, "A Reviewer", "approve", "the pilot", signoffs)
    assert verify(report, signoffs)[0][1:] == [f"  signed: approve by A Reviewer on {trn2['date']}, this report"]


@pytest.mark.parametrize("name, decision, message", [
    ("A Reviewer", "maybe", "DECISION = 'maybe': allowed: approve, reject"),
    ("  ", "approve", "NAME is empty"),
])
def test_a_signoff_needs_a_name_and_a_decision(workspace, name, decision, message):
    with pytest.raises(SignoffError, match=message):
        signoff(workspace / "results" / "report.json", name, decision, "", workspace / "s.jsonl")
    assert not (workspace / "s.jsonl").exists()


def test_signoffs_survive_make_clean():
    from conftest import PROJECT

    clean = next(line for line in (PROJECT / "Makefile").read_text().splitlines() if line.strip().startswith("rm -rf"))
    assert "signoffs" not in clean


def test_a_signoff_given_by_one_path_is_checked_by_another(workspace, monkeypatch):
    monkeypatch.chdir(workspace)
    record = signoff(Path("results/report.json"), "A Reviewer", "reject", "")  # signoffs/ of the workspace
    report = workspace / "results" / "report.json"
    report.write_text(report.read_text().replace('"abc"', '"def"'))
    monkeypatch.chdir(workspace.parent)
    lines, ok = verify(report)
    assert not ok and lines[1].startswith(f"  EDITED SINCE SIGN-OFF reject by A Reviewer on {record['date']}")


# ---- chain of custody: a stage checks what it consumes against what its producer recorded ----


# A stage's summary, or fetch_weights' content record (what the training stages consume in its stead).
@pytest.mark.parametrize("record", ["summary.json", "manifest.json"])
def test_a_consumed_file_that_changed_after_its_producer_recorded_it_is_named(workspace, monkeypatch, record):
    from qwen3_pilot.artifacts import CustodyError, check_custody, custody_problems, write_recorded_json

    monkeypatch.chdir(workspace)
    summary = workspace / "results" / "stage" / record
    artifact = workspace / "results" / "stage" / "weights.bin"
    write_recorded_json(summary, {"stage": "fetch_weights", "artifacts": [
        {"path": "results/stage/weights.bin", "bytes": 4, "sha256": sha256_file(artifact)}]})
    consumed = ["results/stage", f"results/stage/{record}"]  # a folder output and its producer's record
    assert custody_problems(consumed) == []
    recorded = sha256_file(artifact)
    artifact.write_bytes(b"\x00\x01\x02\x05")
    with pytest.raises(CustodyError, match=f"results/stage/weights.bin: fetch_weights recorded sha256 {recorded}, "
                                           f"the file now has {sha256_file(artifact)}"):
        check_custody(consumed)
    # Without the producer's summary among the inputs there is no record to hold the file to.
    assert custody_problems(["results/stage"]) == []
    artifact.unlink()
    assert custody_problems(consumed)[0].endswith("the file now has missing")


def test_a_summary_or_stamp_is_held_to_the_sha256_recorded_beside_it(workspace, monkeypatch):
    """Files no summary lists (the summaries themselves, the pin stamps) carry their digest beside them."""
    from qwen3_pilot.artifacts import custody_problems, write_recorded_json

    monkeypatch.chdir(workspace)
    summary = Path("results/train_hf/summary.json")
    write_recorded_json(summary, {"stage": "train_hf", "figures": {"loss": 4.0}, "artifacts": []})
    assert custody_problems([str(summary)]) == []
    recorded = sha256_file(summary)
    summary.write_text(summary.read_text().replace("4.0", "3.0"))  # a figure edited by hand
    assert custody_problems([str(summary)]) == [
        f"results/train_hf/summary.json: its stage recorded sha256 {recorded}, the file now has {sha256_file(summary)}"]
    Path("results/train_hf/summary.json.sha256").unlink()
    assert custody_problems([str(summary)]) == [
        "results/train_hf/summary.json: no sha256 recorded beside it (results/train_hf/summary.json.sha256): rerun the "
        "stage that writes it"]
    # Files outside results/ (the lock file, a local corpus) are the user's: nothing recorded them.
    Path("workflow/envs").mkdir(parents=True)
    Path("workflow/envs/cpu.lock").write_text("torch==2.14.1\n")
    assert custody_problems(["workflow/envs/cpu.lock"]) == []


def test_make_signoff_records_the_values_as_given_and_never_runs_them(workspace):
    """The Makefile passes NAME, DECISION and NOTE through the environment: a note full of shell syntax is
    recorded as written, and nothing in it runs."""
    import subprocess
    import sys

    from conftest import PROJECT

    venv = Path(sys.executable).parent.parent
    note = """it's fine"; touch pwned; echo "$(touch pwned2)` touch pwned3`"""
    # -o: the venv is taken as it is; never reinstalled from this temp folder (which would point the shared
    # venv's editable install at it) when the pins are newer than its stamp.
    result = subprocess.run(
        ["make", "--no-print-directory", "-f", str(PROJECT / "Makefile"), f"VENV={venv}",
         "-o", f"{venv}/.installed", "signoff"],
        cwd=workspace, capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "NAME": "A Reviewer", "DECISION": "approve", "NOTE": note},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "signed off: approve by A Reviewer" in result.stdout
    (record,) = read_signoffs(workspace / "signoffs" / "signoffs.jsonl")
    assert record["note"] == note and record["name"] == "A Reviewer"
    assert not list(workspace.glob("pwned*"))
