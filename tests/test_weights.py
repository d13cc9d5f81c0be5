"""fetch_weights through huggingface_hub's offline cache: allow-list, hub checksums, safetensors parsing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from huggingface_hub.errors import LocalEntryNotFoundError
from safetensors.torch import save_file

from qwen3_pilot.artifacts import ChecksumError, sha256_file
from qwen3_pilot.stages.fetch_weights.weights import WeightsError, fetch_weights
from qwen3_pilot.stages.fixture_checkpoint.hub_cache import publish_to_hub_cache

REPO = "test-org/tiny"
ALLOW = ["config.json", "*.safetensors", "tokenizer.json"]


@pytest.fixture
def published(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    (src / "tokenizer.json").write_text("{}")
    save_file({"embed.weight": torch.arange(12.0).reshape(3, 4), "norm.weight": torch.ones(4)},
              str(src / "model.safetensors"))
    return src


def publish(src, tmp_path):
    cache = tmp_path / "hub_cache"
    commit = publish_to_hub_cache(src, cache, REPO, "main")
    return cache, commit


def fetch(cache, tmp_path, allow=ALLOW):
    return fetch_weights(repo_id=REPO, revision="main", cache_dir=cache, allow_patterns=allow,
                         offline=True, out_dir=tmp_path / "checkpoint")


def test_fetch_resolves_the_commit_and_records_every_sha256(tmp_path, published):
    cache, commit = publish(published, tmp_path)
    manifest = fetch(cache, tmp_path)
    assert manifest["resolved_commit"] == commit and not manifest["revision_pinned"]
    assert [f["path"] for f in manifest["files"]] == ["config.json", "model.safetensors", "tokenizer.json"]
    for entry in manifest["files"]:
        assert entry["sha256"] == sha256_file(published / entry["path"])
    kinds = {f["path"]: f["hub_checksum_kind"] for f in manifest["files"]}
    assert kinds == {"config.json": "git blob sha1", "model.safetensors": "sha256", "tokenizer.json": "git blob sha1"}
    assert manifest["safetensors_tensors"] == 2 and manifest["parameters_stored"] == 16


def test_pickles_and_code_are_never_fetched(tmp_path, published):
    torch.save({"x": torch.ones(1)}, published / "pytorch_model.bin")
    (published / "modeling_evil.py").write_text("import os\n")
    cache, _ = publish(published, tmp_path)
    manifest = fetch(cache, tmp_path, allow=["*"])
    fetched = {f["path"] for f in manifest["files"]}
    assert "pytorch_model.bin" not in fetched and "modeling_evil.py" not in fetched
    assert not (tmp_path / "checkpoint" / "pytorch_model.bin").exists()


def test_a_blob_that_does_not_match_its_hub_checksum_fails_and_leaves_nothing(tmp_path, published):
    cache, commit = publish(published, tmp_path)
    link = cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / commit / "model.safetensors"
    blob = (link.parent / os.readlink(link)).resolve()
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    blob.write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match=r"model.safetensors: sha256 mismatch"):
        fetch(cache, tmp_path)
    assert not (tmp_path / "checkpoint").exists()


def test_a_corrupted_safetensors_file_is_named(tmp_path, published):
    # Corrupted before publishing, so its checksum matches: the header check must still catch it.
    path = published / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-9])
    cache, _ = publish(published, tmp_path)
    with pytest.raises(WeightsError, match=r"not a safe safetensors file: .*model.safetensors: tensor '.*': "
                                           r"data_offsets \[\d+, \d+\] lie outside the \d+ bytes of data"):
        fetch(cache, tmp_path)
    assert not (tmp_path / "checkpoint").exists()


def test_a_snapshot_without_config_is_refused(tmp_path, published):
    (published / "config.json").unlink()
    cache, _ = publish(published, tmp_path)
    with pytest.raises(WeightsError, match=r"config.json missing from the snapshot"):
        fetch(cache, tmp_path)


def test_an_index_naming_a_missing_tensor_is_refused(tmp_path, published):
    index = {"weight_map": {"embed.weight": "model.safetensors", "lm_head.weight": "model.safetensors"}}
    (published / "model.safetensors.index.json").write_text(json.dumps(index))
    cache, _ = publish(published, tmp_path)
    with pytest.raises(WeightsError, match=r"tensor lm_head.weight not found in model.safetensors"):
        fetch(cache, tmp_path, allow=[*ALLOW, "model.safetensors.index.json"])


def test_an_unknown_revision_fails_offline(tmp_path, published):
    cache, _ = publish(published, tmp_path)
    # huggingface_hub's own error for a revision its offline cache lacks (local_files_only=True).
    with pytest.raises(LocalEntryNotFoundError, match="Cannot find an appropriate cached snapshot folder for the "
                                                      "specified revision on the local disk"):
        fetch_weights(repo_id=REPO, revision="v9", cache_dir=cache, allow_patterns=ALLOW, offline=True,
                      out_dir=tmp_path / "checkpoint")
    assert not Path(tmp_path / "checkpoint").exists()
