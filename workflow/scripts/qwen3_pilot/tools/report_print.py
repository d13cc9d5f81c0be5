"""A report page on paper and on screen, printed by headless Chromium from the page itself (the page's own print
style: A4, the decision on page 1, every detail expanded, no table cut at the right edge):

    python -m qwen3_pilot.tools.report_print pdf [results/report.html] [results/report.pdf]      (make report-pdf)
    python -m qwen3_pilot.tools.report_print screenshot PAGE.html OUT.png [--width 1400 --height 900]

The PDF is a sign-off record: it is printed from a copy of report.html held to the sha256 the report stage recorded
beside it (a report rewritten by a running invocation, or edited, is refused), written beside the HTML only once
complete, with its own sha256 beside it.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ..artifacts import digest_path, record_digest, recorded_digest, sha256_file

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


class PrintError(RuntimeError):
    pass


def browser() -> str:
    for name in BROWSERS:
        if found := shutil.which(name):
            return found
    raise PrintError(f"no Chromium on PATH (looked for {', '.join(BROWSERS)}): install Debian's or Ubuntu's "
                     "`chromium` package")


def run_headless(args: list[str], profile: Path) -> None:
    """Chromium headless, offline and with a throwaway profile; raises with its stderr when it fails."""
    command = [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--no-first-run", f"--user-data-dir={profile}", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise PrintError(f"{' '.join(command)} exited {result.returncode}: {result.stderr.strip()[-2000:]}")


def held_copy(page: Path, folder: Path) -> tuple[Path, str]:
    """A copy of `page` in `folder`, and its sha256, which must be the one recorded beside the page."""
    if not page.is_file():
        raise PrintError(f"{page}: no such report (run `make report` first)")
    recorded = recorded_digest(page)
    if recorded is None:
        raise PrintError(f"{page}: no sha256 recorded beside it ({digest_path(page)}): not a report the workflow "
                         "finished writing")
    copy = folder / page.name
    shutil.copyfile(page, copy)
    if (digest := sha256_file(copy)) != recorded:
        raise PrintError(f"{page}: has sha256 {digest}, the report stage recorded {recorded}: rewritten by a "
                         "running invocation or edited; print it once the run has finished")
    return copy, digest


def print_pdf(page: Path, pdf: Path) -> str:
    """`page` printed to `pdf` (A4 by the page's own @page rule); returns the sha256 of the HTML printed."""
    with tempfile.TemporaryDirectory(prefix="report-print.") as work:
        copy, digest = held_copy(Path(page), Path(work))
        printed = Path(work) / "report.pdf"
        run_headless(["--no-pdf-header-footer", f"--print-to-pdf={printed}", copy.as_uri()], Path(work) / "profile")
        if not printed.is_file() or printed.read_bytes()[:5] != b"%PDF-":
            raise PrintError(f"Chromium wrote no PDF for {page} (expected {printed})")
        Path(pdf).parent.mkdir(parents=True, exist_ok=True)
        staged = Path(pdf).with_name(f".{Path(pdf).name}.partial")
        shutil.copyfile(printed, staged)
        staged.replace(pdf)
    record_digest(Path(pdf))
    return digest


def screenshot(page: Path, png: Path, width: int = 1400, height: int = 900) -> None:
    """The first screen of `page` at `width` x `height` pixels."""
    if not Path(page).is_file():
        raise PrintError(f"{page}: no such page")
    with tempfile.TemporaryDirectory(prefix="report-shot.") as work:
        shot = Path(work) / "shot.png"
        run_headless([f"--window-size={width},{height}", "--hide-scrollbars", f"--screenshot={shot}",
                      Path(page).resolve().as_uri()], Path(work) / "profile")
        Path(png).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, png)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qwen3_pilot.tools.report_print",
                                     description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    pdf = commands.add_parser("pdf", help="print a report page to an A4 PDF")
    pdf.add_argument("page", nargs="?", type=Path, default=Path("results/report.html"))
    pdf.add_argument("out", nargs="?", type=Path, default=Path("results/report.pdf"))
    shot = commands.add_parser("screenshot", help="the first screen of a page as a PNG")
    shot.add_argument("page", type=Path)
    shot.add_argument("out", type=Path)
    shot.add_argument("--width", type=int, default=1400)
    shot.add_argument("--height", type=int, default=900)
    args = parser.parse_args(argv)
    try:
        if args.command == "pdf":
            digest = print_pdf(args.page, args.out)
            print(f"{args.out}: printed from {args.page} (sha256 {digest})")
        else:
            screenshot(args.page, args.out, args.width, args.height)
            print(f"{args.out}: {args.page} at {args.width} x {args.height}")
    except PrintError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
