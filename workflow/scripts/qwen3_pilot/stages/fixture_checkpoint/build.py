"""The fixture itself: a small Qwen3 checkpoint that stands in for Qwen/Qwen3-4B-Instruct-2507 on the CPU backend.

The build machines cannot reach the hub, yet the stages downstream should read weights exactly as
they would read the published ones: through huggingface_hub's cache, with a config.json, a
tokenizer and safetensors. So this module trains a byte-level BPE tokenizer like Qwen's (tokenizer.py), builds a
Qwen3 with the real architecture (GQA, qk-norm, tied embeddings, explicit head_dim) at toy width,
pretrains it briefly so that "the weights loaded" is visible as a loss well below ln(vocab), and
lays the result out as a hub cache that `snapshot_download(..., local_files_only=True)` resolves (hub_cache.py).

torch, transformers and tokenizers are imported inside the functions: the Snakefile may import
this package at parse time, and that should cost milliseconds, not seconds.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .hub_cache import publish_to_hub_cache
from .tokenizer import ENDOFTEXT, IM_END, read_corpus_texts, save_tokenizer, train_tokenizer

if TYPE_CHECKING:
    import torch
    import transformers

FIXTURE_NOTE = (
    "This is a small fixture trained on the pilot's CPU corpus; it stands in for the published "
    "Qwen weights on machines without hub access and is not the published Qwen weights."
)

# The defaults the pipeline uses (config/config.yaml's fixture). Measured on a 2-core box: 754,560 parameters,
# held-out loss 7.68 at random init -> 4.87 after 300 steps (ln 2048 = 7.62); build_fixture took 63-74 s on one
# thread. Four layers cost twice the time per step and ended higher (5.11 after 250 steps); 250 steps at lr 5e-3
# ended at 5.07.


@dataclass(frozen=True, kw_only=True)
class FixtureArchitecture:
    """The fixture's Qwen3 at toy width: config `fixture`'s architecture keys, what its config.json holds."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int
    rope_theta: float
    rms_norm_eps: float

    @classmethod
    def split(cls, settings: dict[str, Any]) -> tuple[FixtureArchitecture, dict[str, Any]]:
        """Config `fixture` as the architecture and the rest (the build's own settings: steps, batch, ...)."""
        names = {field.name for field in fields(cls)}
        return (cls(**{key: value for key, value in settings.items() if key in names}),
                {key: value for key, value in settings.items() if key not in names})


def fixture_hf_config(
    architecture: FixtureArchitecture, *, bos_token_id: int | None = None, eos_token_id: int | None = None
) -> transformers.Qwen3Config:
    """A Qwen3Config at toy width that keeps the features the recipes must get right."""
    from transformers import Qwen3Config

    heads, kv_heads = architecture.num_attention_heads, architecture.num_key_value_heads
    if not kv_heads < heads or heads % kv_heads:
        raise ValueError("GQA needs kv heads < heads, dividing them")
    if architecture.head_dim * heads == architecture.hidden_size:
        # The point of an explicit head_dim: a recipe that derives it as dim // heads must fail here.
        raise ValueError("head_dim must differ from hidden_size // num_attention_heads")
    sizes = {key: value for key, value in asdict(architecture).items() if key != "rope_theta"}
    return Qwen3Config(
        **sizes,
        # transformers 5 keeps theta only in rope_parameters; build_fixture adds the top-level
        # "rope_theta" that the hub's config.json carries.
        rope_parameters={"rope_type": "default", "rope_theta": float(architecture.rope_theta)},
        tie_word_embeddings=True,
        attention_bias=False,
        hidden_act="silu",
        use_sliding_window=False,
        max_window_layers=architecture.num_hidden_layers,
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
    architecture: FixtureArchitecture,
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

    from ...artifacts import staging_dir

    t0 = time.perf_counter()
    # The cache's symlinks are relative, so they survive staging_dir's final rename.
    with staging_dir(Path(out_dir)) as tmp:
        published = tmp / "published"
        texts = read_corpus_texts(corpus_jsonl, limit_chars)
        vocab_size = architecture.vocab_size
        tok = train_tokenizer(texts, vocab_size)
        if tok.get_vocab_size() > vocab_size:
            raise ValueError(f"tokenizer has {tok.get_vocab_size()} tokens, more than vocab_size {vocab_size}")
        eos_id, endoftext_id = tok.token_to_id(IM_END), tok.token_to_id(ENDOFTEXT)
        # Documents end in eos, as torchtitan's dataloader will feed them (encode(add_eos=True)).
        ids = [i for enc in tok.encode_batch(texts) for i in (*enc.ids, eos_id)]

        # bos as in Qwen3's config.json
        config = fixture_hf_config(architecture, bos_token_id=endoftext_id, eos_token_id=eos_id)
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
        cfg["rope_theta"] = float(architecture.rope_theta)  # where the hub's config.json (and older readers) keep it
        config_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        save_tokenizer(tok, published, model_max_length=architecture.max_position_embeddings)

        summary = {
            "fixture": True,
            "note": FIXTURE_NOTE,
            "repo_id": repo_id,
            "revision": revision,
            "parameters": sum(p.numel() for p in model.parameters()),  # tied: embeddings counted once
            **asdict(architecture),
            "rope_theta": _rope_theta(model.config),  # as the saved model holds it
            "tokenizer_size": tok.get_vocab_size(),
            "tie_word_embeddings": True,
            "seq_len": seq_len,
            "batch_size": batch_size,
            "lr": lr,
            "seed": seed,
            "steps": steps,
            "corpus_tokens": len(ids),
            "init_loss": result["init_loss"],
            "final_loss": result["final_loss"],
            "ln_vocab": math.log(architecture.vocab_size),
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
