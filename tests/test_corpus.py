"""fetch_corpus: the download path (over file:// here) with its blob-hash check, and local corpora."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import CORPUS

from qwen3_pilot.artifacts import ChecksumError, git_blob_sha1
from qwen3_pilot.stages.fetch_corpus.corpus import CORPUS_FILE, CorpusError, fetch_corpus, read_documents

DOCS = [{"text": f"document number {i} " * 5} for i in range(3)]


def data_config(**overrides):
    return {"path": None, "url": "", "git_blob_sha1": "0" * 40, "min_chars": 8, "heldout_every": 2, **overrides}


def lines(folder):
    return [json.loads(line)["text"] for line in (folder / CORPUS_FILE).read_text().splitlines()]


@pytest.fixture
def c4_like(tmp_path):
    path = tmp_path / "mirror" / "data.json"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    return path


def test_git_blob_sha1_is_what_git_computes(c4_like):
    expected = subprocess.run(["git", "hash-object", str(c4_like)], capture_output=True, text=True, check=True)
    assert git_blob_sha1(c4_like) == expected.stdout.strip()


def test_download_is_verified_and_split_into_training_and_held_out_documents(tmp_path, c4_like):
    out, heldout = tmp_path / "corpus", tmp_path / "heldout"
    figures = fetch_corpus(data_config(url=c4_like.as_uri(), git_blob_sha1=git_blob_sha1(c4_like)), out, heldout)
    # Every 2nd document held out: the training folder has the 1st and 3rd (stripped), in c4_test's layout.
    texts = [doc["text"].strip() for doc in DOCS]
    assert lines(out) == [texts[0], texts[2]] and lines(heldout) == [texts[1]]
    assert figures["documents"] == 2 and figures["heldout"]["documents"] == 1 and figures["heldout"]["every"] == 2
    assert sorted(p.name for p in out.iterdir()) == [CORPUS_FILE]  # the download itself is not left beside it


def test_a_corpus_too_small_to_hold_a_document_out_fails_naming_the_key(tmp_path, c4_like):
    with pytest.raises(CorpusError, match=r"3 documents, none held out with data.heldout_every = 5"):
        fetch_corpus(data_config(url=c4_like.as_uri(), git_blob_sha1=git_blob_sha1(c4_like), heldout_every=5),
                     tmp_path / "corpus", tmp_path / "heldout")
    assert not (tmp_path / "corpus").exists() and not (tmp_path / "heldout").exists()


def test_checksum_mismatch_fails_and_leaves_nothing(tmp_path, c4_like):
    out = tmp_path / "corpus"
    with pytest.raises(ChecksumError, match=r"git blob sha1 mismatch: expected 0{40} \(data.git_blob_sha1\)"):
        fetch_corpus(data_config(url=c4_like.as_uri()), out, tmp_path / "heldout")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [c4_like.parent]


def test_unreachable_download_says_how_to_go_offline(tmp_path):
    with pytest.raises(CorpusError, match="set data.path to a local corpus"):
        fetch_corpus(data_config(url=(tmp_path / "absent.json").as_uri()), tmp_path / "corpus", tmp_path / "held")


def test_plain_text_is_split_on_blank_lines(tmp_path):
    path = tmp_path / "plays.txt"
    path.write_text("First speaker:\nhello there\n\nshort\n\nSecond speaker:\ngood day to you\n")
    docs, kind = read_documents(path, min_chars=8)
    assert docs == ["First speaker:\nhello there", "Second speaker:\ngood day to you"]
    assert kind == "plain text split on blank lines"


def test_the_shipped_corpus_reads_as_its_readme_records_it(tmp_path):
    figures = fetch_corpus(data_config(path=str(CORPUS), min_chars=32, heldout_every=20), tmp_path / "corpus",
                           tmp_path / "heldout")
    assert figures["documents"] > 1000 and figures["heldout"]["documents"] > 50
    readme = (CORPUS.parent / "README.md").read_text()
    assert figures["source_sha256"] in readme and f"{CORPUS.stat().st_size:,} bytes" in readme


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"text": "ok document here"}\n{"txt": "no"}\n', r"corpus.jsonl:2: expected a JSON object"),
        ('{"text": 5}\n', r'corpus.jsonl:1: "text" must be a string'),
        ('{"text": "tiny"}\n', r"no document of at least 8 characters"),
    ],
)
def test_bad_local_corpus_names_file_and_line(tmp_path, content, message):
    path = tmp_path / "corpus.jsonl"
    path.write_text(content)
    with pytest.raises(CorpusError, match=message):
        fetch_corpus(data_config(path=str(path)), tmp_path / "corpus", tmp_path / "heldout")
    assert not (tmp_path / "corpus").exists()


def test_missing_local_corpus_names_the_key(tmp_path):
    with pytest.raises(CorpusError, match=r"data.path = '.*nope.txt': no such file"):
        fetch_corpus(data_config(path=str(tmp_path / "nope.txt")), tmp_path / "corpus", tmp_path / "heldout")
