"""A small Qwen3 checkpoint that stands in for Qwen/Qwen3-4B-Instruct-2507 on the CPU backend.

The build machines cannot reach the hub, yet the stages downstream should read weights exactly as
they would read the published ones: through huggingface_hub's cache, with a config.json, a
tokenizer and safetensors. So this module trains a byte-level BPE tokenizer like Qwen's, builds a
Qwen3 with the real architecture (GQA, qk-norm, tied embeddings, explicit head_dim) at toy width,
pretrains it briefly so that "the weights loaded" is visible as a loss well below ln(vocab), and
lays the result out as a hub cache that `snapshot_download(..., local_files_only=True)` resolves.

torch, transformers and tokenizers are imported inside the functions: the Snakefile may import
this package at parse time, and that should cost milliseconds, not seconds.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tokenizers
    import torch
    import transformers

# Qwen's own special tokens, in Qwen's order; like Qwen they get the ids after the BPE vocabulary.
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)

# Qwen2/Qwen3's pre-tokenizer split, as in transformers' tokenization_qwen2.py. transformers 5
# rebuilds a "Qwen2Tokenizer" from tokenizer.json's vocab and merges with this very pipeline, so
# the trained tokenizer must use it too or AutoTokenizer and torchtitan would encode differently.
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# ChatML, the format of Qwen3's template without the tool and reasoning branches.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

FIXTURE_NOTE = (
    "This is a small fixture trained on the pilot's CPU corpus; it stands in for the published "
    "Qwen weights on machines without hub access and is not the published Qwen weights."
)

# The defaults the pipeline uses. Measured on a 2-core box: 754,560 parameters, held-out loss
# 7.68 at random init -> 4.87 after 300 steps (ln 2048 = 7.62); build_fixture took 63-74 s on one
# thread. Four layers cost twice the time per step and ended higher (5.11 after 250 steps); 250
# steps at lr 5e-3 ended at 5.07.
# What the hub's default .gitattributes stores in LFS (plus anything over 10 MiB). For these the
# hub's etag, and so the blob's name in the cache, is the content's sha256; for the rest it is
# the git blob sha1.
LFS_SUFFIXES = {".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".model"}
LFS_MIN_BYTES = 10 * 1024 * 1024


def read_corpus_texts(corpus_jsonl: Path, limit_chars: int | None = None) -> list[str]:
    """The non-empty "text" fields of a JSON-lines corpus, whole documents, until limit_chars is reached."""
    texts: list[str] = []
    total = 0
    with open(corpus_jsonl, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            text = json.loads(line)["text"]
            if not text.strip():
                continue
            texts.append(text)
            total += len(text)
            if limit_chars is not None and total >= limit_chars:
                break
    if not texts:
        raise ValueError(f"{corpus_jsonl}: no documents with text")
    return texts


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> tokenizers.Tokenizer:
    """Byte-level BPE with Qwen's pipeline; the three special tokens take the last ids."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors, trainers
    from tokenizers.models import BPE

    tok = Tokenizer(BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIAL_TOKENS),
        min_frequency=2,
        show_progress=False,
        # All 256 bytes, so any text encodes without an unknown token, as with Qwen.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok


def save_tokenizer(tok: tokenizers.Tokenizer, out_dir: Path, *, model_max_length: int = 2048) -> None:
    """tokenizer.json plus a tokenizer_config.json shaped like Qwen3-4B-Instruct-2507's.

    transformers builds its Qwen2Tokenizer from these; torchtitan's HuggingFaceTokenizer reads
    tokenizer.json and takes eos_id from "eos_token" / "added_tokens_decoder" (its dataloader
    refuses a tokenizer without eos_id). bos_token stays null as in Qwen, so torchtitan's
    add_bos=True adds nothing.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    added = {
        str(tok.token_to_id(t)): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "errors": "replace",
        "model_max_length": model_max_length,
        "pad_token": ENDOFTEXT,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def fixture_hf_config(
    *,
    vocab_size: int,
    hidden_size: int,
    num_hidden_layers: int,
    num_attention_heads: int,
    num_key_value_heads: int,
    head_dim: int,
    intermediate_size: int,
    max_position_embeddings: int,
    rope_theta: float,
    rms_norm_eps: float,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
) -> transformers.Qwen3Config:
    """A Qwen3Config at toy width that keeps the features the recipes must get right."""
    from transformers import Qwen3Config

    if not num_key_value_heads < num_attention_heads or num_attention_heads % num_key_value_heads:
        raise ValueError("GQA needs kv heads < heads, dividing them")
    if head_dim * num_attention_heads == hidden_size:
        # The point of an explicit head_dim: a recipe that derives it as dim // heads must fail here.
        raise ValueError("head_dim must differ from hidden_size // num_attention_heads")
    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        head_dim=head_dim,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        # transformers 5 keeps theta only in rope_parameters; build_fixture adds the top-level
        # "rope_theta" that the hub's config.json carries.
        rope_parameters={"rope_type": "default", "rope_theta": float(rope_theta)},
        rms_norm_eps=rms_norm_eps,
        tie_word_embeddings=True,
        attention_bias=False,
        hidden_act="silu",
        use_sliding_window=False,
        max_window_layers=num_hidden_layers,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
    )


def _rope_theta(config) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(config, "rope_theta", float("nan"))))


@contextlib.contextmanager
def _torch_threads(n: int):
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _heldout_loss(model, batch) -> float:
    import torch

    model.eval()
    with torch.no_grad():
        loss = model(input_ids=batch, labels=batch).loss.item()
    model.train()
    return loss


def pretrain(
    model: torch.nn.Module,
    token_ids: torch.Tensor,
    *,
    steps: int,
    seq_len: int,
    batch_size: int,
    lr: float,
    seed: int,
) -> dict:
    """Causal-LM pretraining with AdamW on random windows of a 1-D token stream.

    The stream's tail (one batch) is held out; its loss is measured before and after, so the
    drop shows learning rather than memorised windows.
    """
    import torch

    token_ids = token_ids.flatten().long()
    held = batch_size * seq_len
    if token_ids.numel() < 2 * held + seq_len:
        raise ValueError(f"{token_ids.numel()} tokens: too few for batch {batch_size} x seq {seq_len}")
    train_ids, heldout = token_ids[:-held], token_ids[-held:].view(batch_size, seq_len)

    gen = torch.Generator().manual_seed(seed)
    init_loss = _heldout_loss(model, heldout)
    decay = [p for p in model.parameters() if p.ndim >= 2]  # not the norms' gains
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
    )
    warmup = max(1, steps // 10)

    def schedule(step: int) -> float:  # linear warm-up, cosine to 10 %
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.45 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    losses = []
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, train_ids.numel() - seq_len, (batch_size,), generator=gen)
        batch = torch.stack([train_ids[s : s + seq_len] for s in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(round(loss.item(), 4))
    final_loss = _heldout_loss(model, heldout)
    return {
        "losses": losses,
        "init_loss": init_loss,
        "final_loss": final_loss,
        "train_tokens": int(train_ids.numel()),
        "heldout_tokens": held,
    }


def _is_lfs(name: str, size: int) -> bool:
    return Path(name).suffix in LFS_SUFFIXES or size >= LFS_MIN_BYTES


def publish_to_hub_cache(src_dir: Path, cache_dir: Path, repo_id: str, revision: str = "main") -> str:
    """Lay src_dir's files out as huggingface_hub's cache of repo_id at revision; return the commit.

    Same layout as a real download (file_download.py / _snapshot_download.py): blobs named by
    etag, relative symlinks from snapshots/<commit>/, refs/<revision> holding the commit (no
    newline), and trees/<commit>.json, the listing that huggingface_hub >= 1.x consults to tell
    a complete snapshot from an interrupted one. The commit is a sha1 over names and contents,
    so the same files give the same commit.
    """
    src_dir, cache_dir = Path(src_dir), Path(cache_dir)
    files = sorted(p.relative_to(src_dir).as_posix() for p in src_dir.rglob("*") if p.is_file())
    if not files:
        raise ValueError(f"{src_dir}: nothing to publish")
    org, _, name = repo_id.partition("/")
    if not org or not name or "/" in name:
        raise ValueError(f"repo_id must be 'org/name', got {repo_id!r}")
    repo = cache_dir / f"models--{org}--{name}"
    from huggingface_hub.utils.sha import git_hash

    entries, commit_hash = {}, hashlib.sha1()
    for rel in files:
        data = (src_dir / rel).read_bytes()
        content_sha1 = git_hash(data)
        commit_hash.update(f"{rel}\0{content_sha1}\n".encode())
        if _is_lfs(rel, len(data)):
            # In git the file is an LFS pointer, so the tree's blob_id is the pointer's sha1.
            sha256 = hashlib.sha256(data).hexdigest()
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {len(data)}\n"
            entry = {"size": len(data), "blob_id": git_hash(pointer.encode()),
                     "lfs_sha256": sha256, "lfs_size": len(data)}
            entries[rel] = (sha256, entry)
        else:
            entries[rel] = (content_sha1, {"size": len(data), "blob_id": content_sha1})
    commit = commit_hash.hexdigest()

    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot = repo / "snapshots" / commit
    for rel, (etag, _) in entries.items():
        blob = repo / "blobs" / etag
        if not blob.exists():
            tmp = blob.with_name(etag + ".incomplete")  # huggingface_hub's own suffix for partial blobs
            shutil.copyfile(src_dir / rel, tmp)
            os.replace(tmp, blob)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "trees").mkdir(exist_ok=True)
    tree = {"format_version": 1, "files": {rel: entry for rel, (_, entry) in entries.items()}}
    (repo / "trees" / f"{commit}.json").write_text(json.dumps(tree, indent=1))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / revision).write_text(commit)
    return commit


def _model_card(repo_id: str, summary: dict) -> str:
    return (
        f"# {repo_id} (CPU fixture)\n\n{FIXTURE_NOTE}\n\n"
        f"Qwen3 architecture, {summary['parameters']:,} parameters; held-out loss "
        f"{summary['init_loss']:.3f} at random init, {summary['final_loss']:.3f} after "
        f"{summary['steps']} steps (ln(vocab) = {summary['ln_vocab']:.3f}).\n"
    )


def build_fixture(
    corpus_jsonl: Path,
    out_dir: Path,
    *,
    repo_id: str,
    revision: str = "main",
    vocab_size: int,
    hidden_size: int,
    num_hidden_layers: int,
    num_attention_heads: int,
    num_key_value_heads: int,
    head_dim: int,
    intermediate_size: int,
    max_position_embeddings: int,
    rope_theta: float,
    rms_norm_eps: float,
    seq_len: int,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    limit_chars: int | None = None,
    num_threads: int = 1,
) -> dict:
    """Tokenizer, model, pretraining, save, publish: out_dir/{published,hub_cache,summary.json}.

    Everything is written under a temporary sibling and moved into place at the end, so an
    interrupted build never leaves an out_dir that looks finished. Same inputs give the same
    bytes (checked with 1 and 2 threads). One thread is the default because ops this small gain
    little from more and lose a lot when another process shares the cores: on 2 cores, 47 s with
    2 threads on an idle box but 125 s beside a busy process, against 63-74 s with one.
    """
    import torch
    from huggingface_hub import snapshot_download
    from transformers import GenerationConfig, Qwen3ForCausalLM

    from .artifacts import staging_dir

    t0 = time.perf_counter()
    # The cache's symlinks are relative, so they survive staging_dir's final rename.
    with staging_dir(Path(out_dir)) as tmp:
        published = tmp / "published"
        texts = read_corpus_texts(corpus_jsonl, limit_chars)
        tok = train_tokenizer(texts, vocab_size)
        if tok.get_vocab_size() > vocab_size:
            raise ValueError(f"tokenizer has {tok.get_vocab_size()} tokens, more than vocab_size {vocab_size}")
        eos_id, endoftext_id = tok.token_to_id(IM_END), tok.token_to_id(ENDOFTEXT)
        # Documents end in eos, as torchtitan's dataloader will feed them (encode(add_eos=True)).
        ids = [i for enc in tok.encode_batch(texts) for i in (*enc.ids, eos_id)]

        config = fixture_hf_config(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            num_hidden_layers=num_hidden_layers,
            num_attention_heads=num_attention_heads,
            num_key_value_heads=num_key_value_heads,
            head_dim=head_dim,
            intermediate_size=intermediate_size,
            max_position_embeddings=max_position_embeddings,
            rope_theta=rope_theta,
            rms_norm_eps=rms_norm_eps,
            bos_token_id=endoftext_id,  # as in Qwen3's config.json
            eos_token_id=eos_id,
        )
        with _torch_threads(num_threads):
            torch.manual_seed(seed)
            model = Qwen3ForCausalLM(config)
            result = pretrain(
                model, torch.tensor(ids), steps=steps, seq_len=seq_len, batch_size=batch_size, lr=lr, seed=seed
            )

        # Qwen3-4B-Instruct-2507's sampling defaults and stop tokens.
        model.generation_config = GenerationConfig(
            bos_token_id=endoftext_id,
            eos_token_id=[eos_id, endoftext_id],
            pad_token_id=endoftext_id,
            do_sample=True,
            temperature=0.7,
            top_p=0.8,
            top_k=20,
        )
        model.save_pretrained(published, safe_serialization=True)
        config_path = published / "config.json"
        cfg = json.loads(config_path.read_text())
        cfg["rope_theta"] = float(rope_theta)  # where the hub's config.json (and older readers) keep it
        config_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        save_tokenizer(tok, published, model_max_length=max_position_embeddings)

        summary = {
            "fixture": True,
            "note": FIXTURE_NOTE,
            "repo_id": repo_id,
            "revision": revision,
            "parameters": sum(p.numel() for p in model.parameters()),  # tied: embeddings counted once
            "vocab_size": vocab_size,
            "tokenizer_size": tok.get_vocab_size(),
            "hidden_size": hidden_size,
            "num_hidden_layers": num_hidden_layers,
            "num_attention_heads": num_attention_heads,
            "num_key_value_heads": num_key_value_heads,
            "head_dim": head_dim,
            "intermediate_size": intermediate_size,
            "max_position_embeddings": max_position_embeddings,
            "rope_theta": _rope_theta(model.config),
            "rms_norm_eps": rms_norm_eps,
            "tie_word_embeddings": True,
            "seq_len": seq_len,
            "batch_size": batch_size,
            "lr": lr,
            "seed": seed,
            "steps": steps,
            "corpus_tokens": len(ids),
            "init_loss": result["init_loss"],
            "final_loss": result["final_loss"],
            "ln_vocab": math.log(vocab_size),
            "losses": result["losses"],
        }
        (published / "README.md").write_text(_model_card(repo_id, summary))
        summary["commit"] = publish_to_hub_cache(published, tmp / "hub_cache", repo_id, revision)

        # Resolve it the way the fetch stage will, before declaring it finished.
        snap = Path(snapshot_download(repo_id, revision=revision, cache_dir=tmp / "hub_cache", local_files_only=True))
        if sorted(p.name for p in snap.iterdir()) != sorted(p.name for p in published.iterdir()):
            raise RuntimeError(f"hub cache snapshot {snap} does not match {published}")

        summary["seconds"] = round(time.perf_counter() - t0, 2)
        (tmp / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
