"""The report as a reviewer reads it, in headless Chromium (installed by .ci/run): the verdict and every stage's
deciding figure on the first screen at 1400 x 900, nothing wider than the page, each stage's record one click away,
and an A4 PDF with the decision on page 1 and every detail expanded. The failed run's first screen is checked in
test_reruns.py, where the failed run is made."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from browser import open_page
from report_page import FIRST_SCREEN, OPEN_ALL, OPENED_BY_LINK, WIDTHS, words_in_order

from qwen3_pilot.artifacts import sha256_file
from qwen3_pilot.decisions import deciding_figure
from qwen3_pilot.stages import STAGES
from qwen3_pilot.tools.report_print import print_pdf

pytestmark = [pytest.mark.chromium, pytest.mark.usefixtures("chromium")]

VIEWPORT = (1400, 900)


def report(run):
    return json.loads((run / "results" / "report.json").read_text())


def page_uri(run):
    return (run / "results" / "report.html").as_uri()


def test_the_first_screen_holds_the_verdict_and_every_stages_status_and_deciding_figure(completed_run):
    stages = {stage["stage"]: stage for stage in report(completed_run)["stages"]}
    with open_page(page_uri(completed_run), *VIEWPORT) as page:
        screen = page.evaluate(FIRST_SCREEN)
    assert screen["viewport"] == VIEWPORT[1]
    assert screen["verdict"] == "pass" and screen["verdict_bottom"] <= VIEWPORT[1]
    assert [row["stage"] for row in screen["rows"]] == [name for name, _ in STAGES]
    for row in screen["rows"]:
        assert row["bottom"] <= VIEWPORT[1], f"{row['stage']}'s row ends at {row['bottom']} px, below the first screen"
        assert row["status"] == "pass"
        assert row["figure"] == deciding_figure(stages[row["stage"]]) != "see details"
    # Details collapsed, the whole page is at most four screens.
    assert screen["height"] <= 4 * VIEWPORT[1], f"the page is {screen['height']} px tall"


def test_nothing_is_wider_than_the_page_with_details_collapsed_or_open(completed_run):
    with open_page(page_uri(completed_run), 1280, 900) as page:
        collapsed = page.evaluate(WIDTHS)
        assert page.evaluate(OPEN_ALL) > len(STAGES)
        opened = page.evaluate(WIDTHS)
    assert collapsed[0] == collapsed[1] and opened[0] == opened[1], (collapsed, opened)


def test_every_stages_record_opens_from_its_row(completed_run):
    with open_page(page_uri(completed_run), *VIEWPORT) as page:
        opened = page.evaluate(OPENED_BY_LINK)
    assert [stage for stage, _, _ in opened] == [name for name, _ in STAGES]
    assert all(not before and after for _, before, after in opened), opened


def pdf_text(pdf, *pages: int) -> str:
    first_last = ["-f", str(pages[0]), "-l", str(pages[-1])] if pages else []
    return subprocess.run(["pdftotext", *first_last, str(pdf), "-"], capture_output=True, text=True, check=True).stdout


def test_the_pdf_is_a4_with_the_decision_on_page_1_and_every_record_expanded(completed_run, tmp_path):
    page = completed_run / "results" / "report.html"
    pdf = tmp_path / "report.pdf"
    # Printed from the report the report stage recorded, and recorded itself.
    assert print_pdf(page, pdf) == (completed_run / "results" / "report.html.sha256").read_text().split()[0]
    assert (tmp_path / "report.pdf.sha256").read_text().split()[0] == sha256_file(pdf)
    info = subprocess.run(["pdfinfo", str(pdf)], capture_output=True, text=True, check=True).stdout
    assert re.search(r"Page size:\s+59[45]\.\d+ x 841\.\d+ pts \(A4\)", info), info
    first = pdf_text(pdf, 1)
    assert words_in_order("Verdict: pass on the cpu", first), first[:2000]
    for stage in report(completed_run)["stages"]:
        assert words_in_order(stage["title"], first), stage["title"]
        assert words_in_order(deciding_figure(stage), first), (stage["stage"], deciding_figure(stage), first)
    # Print expands every stage's record: what it proves, and each stage's artifacts table.
    everything = pdf_text(pdf)
    assert everything.count("Proves:") == len(STAGES)
