"""Stage fetch_corpus: the training corpus, downloaded and checked or read from a local file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..corpus import CORPUS_FILE, fetch_corpus


def run(data: dict[str, Any], backend: str, out_dir: Path, summary_path: Path) -> dict[str, Any]:
    from ..summary import StageSummary

    figures = fetch_corpus(data, out_dir)
    summary = StageSummary(
        stage="fetch_corpus",
        status="pass",
        backend=backend,
        figures=figures,
        proves=(
            "The downloaded c4_test has the git blob sha1 of torchtitan's tests/assets/c4_test/data.json."
            if data["path"] is None
            else "The local corpus file was read, split into documents and written in the format torchtitan's "
            "c4_test loader reads; its sha256 is recorded."
        ),
        does_not_prove=(
            "Anything about the corpus's quality or licence; "
            + ("that it is c4_test: it is the offline stand-in named in data.path." if data["path"] else
               "that the pinned commit is the one the seed recipe used.")
        ),
    )
    summary.add_artifacts([out_dir / CORPUS_FILE])
    return summary.write(summary_path)
