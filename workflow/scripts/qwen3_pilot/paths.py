"""Where the pilot's files are, in one place: the checkout's folders (derived once, from this package's place in
it) and the layout of a workflow folder (its results, logs' failure records, caches, report and plan), which the
stages, the report, the audit, the archive and the command-line tools share. Torch-free; read at parse time."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .trainer_run import LAUNCH_RECORD

# The checkout: the package lives in workflow/scripts/ of the project.
PACKAGE = Path(__file__).resolve().parent
SCRIPTS = PACKAGE.parent  # the package's import root: what relaunches and other torchtitans put on PYTHONPATH
WORKFLOW = SCRIPTS.parent  # workflow/: the schemas, the resources that ship with the pilot
PROJECT = WORKFLOW.parent  # the project root: config/, profiles/, workflow/ (the Snakefile, its rules, envs)


@dataclass(frozen=True)
class RunFolder:
    """A workflow folder's files: `root` is the folder Snakemake runs in (a job's working directory, where the
    default "." points), or a copy of one (tests, `make titan-compat` on a finished run)."""

    root: Path = Path(".")

    @property
    def results(self) -> Path:
        return self.root / "results"

    @property
    def cache(self) -> Path:
        """The project's library caches (Hugging Face, torch.compile, matplotlib, the ranks' temp folder)."""
        return self.root / ".cache"

    @property
    def failures(self) -> Path:
        """The failure records: outside every rule's outputs, which Snakemake deletes when a job fails."""
        return self.results / "failures"

    def failure_record(self, stage: str) -> Path:
        return self.failures / f"{stage}.json"

    @property
    def report_json(self) -> Path:
        return self.results / "report.json"

    @property
    def report_html(self) -> Path:
        return self.results / "report.html"

    @property
    def plan(self) -> Path:
        """The invocation's plan, recorded at its start (parse_time/plan.py)."""
        return self.results / "invocation.json"

    def launch_record(self, stage: str, launch: str) -> Path:
        """The command and environment of a trainer launch a stage made (launch.py writes it)."""
        return self.results / stage / launch / LAUNCH_RECORD


# The folder a job or a command runs in.
HERE = RunFolder()
