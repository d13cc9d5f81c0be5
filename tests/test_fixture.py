"""The CPU stand-in for the published Qwen3 checkpoint: tokenizer, model, pretraining, hub cache.

One tiny build (about 10 s on 2 cores) is shared by most tests; the figures for the pipeline's
defaults are in qwen3_pilot/stages/fixture_checkpoint/build.py.
"""

import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

# Anything that tried the network would otherwise wait on timeouts on the offline build machines.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
from conftest import CORPUS

from qwen3_pilot.paths import SCRIPTS
from qwen3_pilot.stages.fixture_checkpoint import build as fixture_build
from qwen3_pilot.stages.fixture_checkpoint import hub_cache as fixture_hub_cache
from qwen3_pilot.stages.fixture_checkpoint import tokenizer as fixture_tokenizer

REPO_ID = "Qwen/Qwen3-4B-Instruct-2507"
# head_dim 32 with 4 heads is 128 wide, twice hidden_size: a reader that derives head_dim from
# hidden_size // heads gets 16 and fails.
TINY_MODEL = dict(
    vocab_size=512,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    intermediate_size=128,
    max_position_embeddings=256,
    rope_theta=5_000_000.0,
    rms_norm_eps=1e-6,
)
TINY_TRAIN = dict(seq_len=64, steps=150, batch_size=8, lr=1e-2, seed=0)
TINY_ARCHITECTURE = fixture_build.FixtureArchitecture(**TINY_MODEL)
TINY = dict(**TINY_TRAIN, limit_chars=150_000, architecture=TINY_ARCHITECTURE)
SAMPLES = [
    "First Citizen:\nBefore we proceed any further, hear me speak.",
    "  leading spaces, trailing tab\t and\r\nCRLF\n\n\nblank lines",
    "numbers 1234567 and punctuation?!... 'tis o'er",
    "unicode: café, naïve, Ærø, 日本語, emoji 🎭",
]


def _documents() -> list[str]:
    assert CORPUS.is_file(), f"the shipped corpus {CORPUS} is missing (config/config.yaml data.path)"
    text = CORPUS.read_text(encoding="utf-8")
    return [d.strip() for d in re.split(r"\n\s*\n", text) if d.strip()]


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for doc in _documents():
            f.write(json.dumps({"text": doc}) + "\n")
    return path


@pytest.fixture(scope="module")
def built(corpus, tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("build") / "fixture"
    summary = fixture_build.build_fixture(corpus, out_dir, repo_id=REPO_ID, revision="main", **TINY)
    return out_dir, summary


def _storage(cache_dir: Path) -> Path:
    return cache_dir / "models--Qwen--Qwen3-4B-Instruct-2507"


def test_import_does_not_load_heavy_packages():
    code = ("import sys, qwen3_pilot.stages.fixture_checkpoint; "
            "print(sorted({'torch', 'transformers', 'tokenizers'} & set(sys.modules)))")
    env = dict(os.environ, PYTHONPATH=str(SCRIPTS))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_read_corpus_texts_skips_empty_documents_and_stops_at_the_limit(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(json.dumps({"text": t}) for t in ["aaaa", "", "  ", "bbbb", "cccc"]) + "\n\n")
    assert fixture_tokenizer.read_corpus_texts(path, None) == ["aaaa", "bbbb", "cccc"]
    assert fixture_tokenizer.read_corpus_texts(path, 5) == ["aaaa", "bbbb"]
    path.write_text(json.dumps({"text": ""}) + "\n")
    with pytest.raises(ValueError, match="no documents"):
        fixture_tokenizer.read_corpus_texts(path, None)


def test_tokenizer_round_trips_and_loads_in_transformers_and_torchtitan(corpus, tmp_path):
    from torchtitan.components.tokenizer import HuggingFaceTokenizer
    from torchtitan.experiments.transformers_modeling_backend.tokenizer import HFBackendTokenizer
    from transformers import AutoTokenizer

    texts = fixture_tokenizer.read_corpus_texts(corpus, 100_000)
    tok = fixture_tokenizer.train_tokenizer(texts, 512)
    assert tok.to_str() == fixture_tokenizer.train_tokenizer(texts, 512).to_str(), "training is not deterministic"
    assert tok.get_vocab_size() == 512
    # Like Qwen: the special tokens follow the BPE vocabulary.
    assert [tok.token_to_id(t) for t in fixture_tokenizer.SPECIAL_TOKENS] == [509, 510, 511]
    for s in SAMPLES:
        assert tok.decode(tok.encode(s).ids) == s
    assert tok.encode(fixture_tokenizer.IM_END).ids == [511]

    fixture_tokenizer.save_tokenizer(tok, tmp_path)
    hf = AutoTokenizer.from_pretrained(tmp_path)
    titan = HuggingFaceTokenizer(tokenizer_path=str(tmp_path))
    backend = HFBackendTokenizer(tokenizer_path=str(tmp_path))
    assert (hf.eos_token, hf.pad_token, hf.bos_token) == (fixture_tokenizer.IM_END, fixture_tokenizer.ENDOFTEXT, None)
    assert (titan.eos_id, titan.bos_id, backend.eos_id) == (511, None, 511)
    assert len(hf) == titan.vocab_size == 512
    for s in SAMPLES + [f"{fixture_tokenizer.IM_START}user\nhi{fixture_tokenizer.IM_END}"]:
        ids = tok.encode(s).ids
        assert hf(s)["input_ids"] == ids
        assert hf.decode(ids) == s
        # torchtitan's dataloader encodes with add_bos=True, add_eos=True; Qwen has no bos token.
        assert titan.encode(s, add_bos=True, add_eos=True) == ids + [511]
    messages = [{"role": "user", "content": "Speak, speak."}]
    chat = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nSpeak, speak.<|im_end|>\n<|im_start|>assistant\n"
    assert titan.apply_chat_template(messages, add_generation_prompt=True) == chat


def test_fixture_hf_config_keeps_the_qwen3_features():
    config = fixture_build.fixture_hf_config(TINY_ARCHITECTURE)
    assert config.model_type == "qwen3"
    assert config.head_dim == 32 != config.hidden_size // config.num_attention_heads
    assert config.num_key_value_heads < config.num_attention_heads
    assert config.tie_word_embeddings is True
    assert config.rope_parameters["rope_theta"] == 5_000_000.0
    with pytest.raises(ValueError, match="head_dim"):
        fixture_build.fixture_hf_config(replace(TINY_ARCHITECTURE, head_dim=16))
    with pytest.raises(ValueError, match="GQA"):
        fixture_build.fixture_hf_config(replace(TINY_ARCHITECTURE, num_key_value_heads=4))


def test_config_fixture_splits_into_the_architecture_and_the_builds_own_settings():
    settings = {**TINY_MODEL, **TINY_TRAIN, "limit_chars": None}
    assert fixture_build.FixtureArchitecture.split(settings) == (TINY_ARCHITECTURE, {**TINY_TRAIN, "limit_chars": None})


def test_build_summary_reports_a_trained_fixture(built):
    out_dir, summary = built
    assert summary["fixture"] is True and "not the published Qwen weights" in summary["note"]
    assert summary["repo_id"] == REPO_ID and summary["revision"] == "main"
    assert re.fullmatch(r"[0-9a-f]{40}", summary["commit"])
    assert (_storage(out_dir / "hub_cache") / "refs" / "main").read_text() == summary["commit"]
    for key, value in TINY_MODEL.items():
        assert summary[key] == value, key
    assert summary["parameters"] == 131_520
    assert len(summary["losses"]) == summary["steps"] == TINY["steps"]
    assert summary["ln_vocab"] == pytest.approx(math.log(512))
    # Random init predicts about uniformly; the published fixture must be far from that, or the
    # stages' "weights loaded" check (step-1 loss well below ln(vocab)) could not tell them apart.
    assert abs(summary["init_loss"] - summary["ln_vocab"]) < 0.3
    assert summary["final_loss"] < summary["init_loss"] - 1.0
    assert summary["seconds"] > 0
    saved = json.loads((out_dir / "summary.json").read_text())
    assert saved == summary
    assert sorted(p.name for p in out_dir.parent.iterdir()) == ["fixture"], "temporary folders left behind"


def test_published_model_reloads_from_safetensors_with_the_trained_weights(built, corpus):
    import torch
    from safetensors import safe_open
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    out_dir, summary = built
    published = out_dir / "published"
    assert sorted(p.name for p in published.iterdir()) == [
        "README.md",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    config = json.loads((published / "config.json").read_text())
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] == 5_000_000.0
    assert config["head_dim"] == 32 and config["tie_word_embeddings"] is True
    with safe_open(published / "model.safetensors", "pt") as f:
        keys = set(f.keys())
    assert "lm_head.weight" not in keys and "model.embed_tokens.weight" in keys
    assert "model.layers.0.self_attn.q_norm.weight" in keys

    model = AutoModelForCausalLM.from_pretrained(published)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.weight.shape == (4 * 32, 64)
    assert attn.k_proj.weight.shape == (2 * 32, 64)
    assert attn.q_norm.weight.shape == (32,)

    # The held-out batch that pretrain scored: the tail of the corpus stream, documents ended by eos.
    tok = Tokenizer.from_file(str(published / "tokenizer.json"))
    eos = tok.token_to_id(fixture_tokenizer.IM_END)
    texts = fixture_tokenizer.read_corpus_texts(corpus, TINY["limit_chars"])
    stream = [i for enc in tok.encode_batch(texts) for i in (*enc.ids, eos)]
    held = TINY["batch_size"] * TINY["seq_len"]
    batch = torch.tensor(stream[-held:]).view(TINY["batch_size"], TINY["seq_len"])
    with torch.no_grad():
        loss = model(input_ids=batch, labels=batch).loss.item()
    assert loss == pytest.approx(summary["final_loss"], abs=1e-4)


def test_hub_cache_resolves_offline_through_huggingface_hub(built):
    from huggingface_hub import hf_hub_download, snapshot_download
    from transformers import AutoModelForCausalLM

    out_dir, summary = built
    cache, commit = out_dir / "hub_cache", summary["commit"]
    model = AutoModelForCausalLM.from_pretrained(REPO_ID, cache_dir=cache, local_files_only=True)
    assert model.num_parameters() == summary["parameters"]
    snapshot = snapshot_download(REPO_ID, revision="main", cache_dir=cache, local_files_only=True)
    assert Path(snapshot) == _storage(cache) / "snapshots" / commit
    by_commit = snapshot_download(REPO_ID, revision=commit, cache_dir=cache, local_files_only=True)
    assert by_commit == snapshot
    for src in (out_dir / "published").iterdir():
        path = Path(hf_hub_download(REPO_ID, src.name, revision="main", cache_dir=cache, local_files_only=True))
        assert path.read_bytes() == src.read_bytes()
        target = os.readlink(path)
        assert not os.path.isabs(target) and target.startswith("../../blobs/")

    blobs = _storage(cache) / "blobs"
    weights = (out_dir / "published" / "model.safetensors").read_bytes()
    assert (blobs / hashlib.sha256(weights).hexdigest()).exists(), "LFS blobs are named by sha256"
    config = (out_dir / "published" / "config.json").read_bytes()
    git_sha1 = hashlib.sha1(b"blob %d\0" % len(config) + config).hexdigest()
    assert (blobs / git_sha1).exists(), "small files are named by their git blob sha1"


def test_snapshot_with_a_missing_file_is_reported_incomplete(built, tmp_path):
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import IncompleteSnapshotError

    out_dir, _ = built
    commit = fixture_hub_cache.publish_to_hub_cache(out_dir / "published", tmp_path, REPO_ID)
    (_storage(tmp_path) / "snapshots" / commit / "model.safetensors").unlink()
    with pytest.raises(IncompleteSnapshotError):
        snapshot_download(REPO_ID, cache_dir=tmp_path, local_files_only=True)


def test_publish_commit_is_stable_and_follows_content(built, tmp_path):
    from huggingface_hub import snapshot_download

    out_dir, summary = built
    published = out_dir / "published"
    first = fixture_hub_cache.publish_to_hub_cache(published, tmp_path / "a", REPO_ID)
    assert first == fixture_hub_cache.publish_to_hub_cache(published, tmp_path / "b", REPO_ID) == summary["commit"]
    # Republishing is a no-op.
    assert fixture_hub_cache.publish_to_hub_cache(published, tmp_path / "a", REPO_ID) == first

    changed = tmp_path / "changed"
    shutil.copytree(published, changed)
    with open(changed / "README.md", "a") as f:
        f.write("one more line\n")
    second = fixture_hub_cache.publish_to_hub_cache(changed, tmp_path / "a", REPO_ID)
    assert second != first
    assert (_storage(tmp_path / "a") / "refs" / "main").read_text() == second
    for commit, src in [(first, published), (second, changed)]:
        snap = Path(snapshot_download(REPO_ID, revision=commit, cache_dir=tmp_path / "a", local_files_only=True))
        assert (snap / "README.md").read_bytes() == (src / "README.md").read_bytes()


def test_rebuild_is_byte_identical_and_replaces_a_stale_out_dir(corpus, built, tmp_path):
    out_dir, summary = built
    again = tmp_path / "fixture"
    again.mkdir()
    (again / "stale.txt").write_text("from an older build")
    second = fixture_build.build_fixture(corpus, again, repo_id=REPO_ID, revision="main", **TINY)
    assert second["commit"] == summary["commit"]
    assert (again / "published" / "model.safetensors").read_bytes() == (
        out_dir / "published" / "model.safetensors"
    ).read_bytes()
    assert not (again / "stale.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fixture"]


def test_failed_build_leaves_no_out_dir(corpus, tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(fixture_build, "publish_to_hub_cache", fail)  # as build_fixture calls it
    with pytest.raises(RuntimeError, match="disk full"):
        fixture_build.build_fixture(corpus, tmp_path / "fixture", repo_id=REPO_ID, revision="main",
                                    **{**TINY, "steps": 2})
    assert list(tmp_path.iterdir()) == []
