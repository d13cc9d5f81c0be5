"""The training corpus (what stage fetch_corpus fetches): c4_test from the torchtitan repository at a pinned
commit (verified by its git blob sha1), or a local file (the corpus that ships with the pilot by default).
Written as `<out>/data.json`, JSON lines with a "text" field: the folder torchtitan's `c4_test` loader
(`load_dataset(path, split="train")`) reads; every data.heldout_every-th document goes to a held-out folder of the
same layout instead, which only the convergence stage's validation reads."""

from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path
from typing import Any

from ...artifacts import ChecksumError, git_blob_sha1, sha256_file, staging_dir

CORPUS_FILE = "data.json"


class CorpusError(ValueError):
    pass


def download(url: str, dest: Path, expected_git_sha1: str, timeout: float = 120) -> None:
    """Downloads `url` to `dest` (any scheme urllib knows, file:// included) and checks its blob hash."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, open(dest, "wb") as out:
            shutil.copyfileobj(response, out)
    except OSError as error:
        raise CorpusError(
            f"download of {url} failed ({error}); on an offline machine set data.path to a local corpus "
            f"(config/config.yaml sets the corpus that ships with the pilot)"
        ) from error
    actual = git_blob_sha1(dest)
    if actual != expected_git_sha1:
        raise ChecksumError(
            f"{url}: git blob sha1 mismatch: expected {expected_git_sha1} (data.git_blob_sha1), got {actual}"
        )


def read_documents(path: Path, min_chars: int) -> tuple[list[str], str]:
    """Documents from JSON lines with "text", or from plain text split on blank lines."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"data.path = {str(path)!r}: no such file")
    raw = path.read_text(encoding="utf-8", errors="strict")
    first = next((line for line in raw.splitlines() if line.strip()), "")
    if first.lstrip().startswith("{"):
        docs = []
        for number, line in enumerate(raw.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                text = json.loads(line)["text"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise CorpusError(
                    f"{path}:{number}: expected a JSON object with a \"text\" string on every line"
                ) from None
            if not isinstance(text, str):
                raise CorpusError(f"{path}:{number}: \"text\" must be a string, got {type(text).__name__}")
            docs.append(text)
        kind = "jsonl"
    else:
        docs = raw.split("\n\n")
        kind = "plain text split on blank lines"
    docs = [d.strip() for d in docs if len(d.strip()) >= min_chars]
    if not docs:
        raise CorpusError(f"{path}: no document of at least {min_chars} characters (data.min_chars)")
    return docs, kind


def split_documents(docs: list[str], heldout_every: int) -> tuple[list[str], list[str]]:
    """(training documents, held-out documents): every `heldout_every`-th document, counted from 1, is held out. The
    same corpus always splits the same way."""
    heldout = [doc for index, doc in enumerate(docs, 1) if index % heldout_every == 0]
    training = [doc for index, doc in enumerate(docs, 1) if index % heldout_every != 0]
    return training, heldout


def write_documents(docs: list[str], folder: Path) -> Path:
    """`docs` as JSON lines with "text" in `folder`/CORPUS_FILE, the layout torchtitan's c4_test loader reads."""
    target = folder / CORPUS_FILE
    with open(target, "w", encoding="utf-8") as out:
        for doc in docs:
            out.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")
    return target


def fetch_corpus(data: dict[str, Any], out_dir: Path, heldout_dir: Path) -> dict[str, Any]:
    """Writes the training documents to `out_dir` and the held-out ones (data.heldout_every) to `heldout_dir`, each
    folder atomically, and returns their figures. Every stage that trains reads `out_dir`; only the convergence
    stage's validation reads `heldout_dir`, so no training run, the fixture's pretraining included, sees it."""
    with staging_dir(out_dir) as tmp:
        if data["path"] is None:
            download(data["url"], tmp / "download.json", data["git_blob_sha1"])
            docs, _ = read_documents(tmp / "download.json", 1)
            (tmp / "download.json").unlink()
            figures = {"source": data["url"], "kind": "c4_test download", "git_blob_sha1": data["git_blob_sha1"]}
        else:
            docs, kind = read_documents(Path(data["path"]), data["min_chars"])
            figures = {
                "source": str(data["path"]),
                "kind": f"local file ({kind})",
                "source_sha256": sha256_file(Path(data["path"])),
            }
        training, heldout = split_documents(docs, data["heldout_every"])
        if not heldout:
            raise CorpusError(f"{figures['source']}: {len(docs)} documents, none held out with data.heldout_every = "
                              f"{data['heldout_every']}: the convergence stage needs a held-out split")
        target = write_documents(training, tmp)
        figures.update(documents=len(training), characters=sum(len(d) for d in training), bytes=target.stat().st_size)
    with staging_dir(heldout_dir) as tmp:
        target = write_documents(heldout, tmp)
        figures["heldout"] = {"every": data["heldout_every"], "documents": len(heldout),
                              "characters": sum(len(d) for d in heldout), "bytes": target.stat().st_size}
    return figures
