"""Stage fetch_corpus: the training corpus, downloaded and checked or read from a local file, and its held-out
split."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .corpus import CORPUS_FILE, fetch_corpus


def run(data: dict[str, Any], backend: str, out_dir: Path, heldout_dir: Path, summary_path: Path) -> dict[str, Any]:
    from ...summary import StageSummary

    figures = fetch_corpus(data, out_dir, heldout_dir)
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
        ) + (f" Every {data['heldout_every']}th document ({figures['heldout']['documents']} in all) is held out in "
             "a folder of its own, recorded with its sha256, which no training run reads."),
        does_not_prove=(
            "Anything about the corpus's quality or licence; "
            + ("that it is c4_test: it is the offline stand-in named in data.path." if data["path"] else
               "that the pinned commit is the one the seed recipe used.")
        ),
    )
    summary.add_artifacts([out_dir / CORPUS_FILE, heldout_dir / CORPUS_FILE])
    return summary.write(summary_path)
