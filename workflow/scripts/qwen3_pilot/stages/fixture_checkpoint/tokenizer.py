"""The fixture's tokenizer: byte-level BPE with Qwen's pre-tokenizer, special tokens and chat template, trained on
the pilot's corpus, and saved as Qwen3-4B-Instruct-2507's tokenizer files are shaped. tokenizers is imported
inside the functions."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tokenizers

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
