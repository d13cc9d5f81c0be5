"""A recipe's Hugging Face export at its last step (what stage export_reload checks): completed into a folder
that loads on its own and reloaded with transformers; its logits checked against torchtitan's model.

torchtitan's `last_save_in_hf` writes safetensors and an index only (DESIGN.md): no config.json, tokenizer
or generation config, a duplicate `sharded/` folder, and no `lm_head.weight` when embeddings are tied.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

from ...artifacts import staging_dir

# Taken from the fetched checkpoint; the export has the weights only.
COMPANION_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")
EXPORT_SUFFIXES = (".safetensors", ".json")  # the shards and model.safetensors.index.json
TIED_HEAD = "lm_head.weight"
INDEX_FILE = "model.safetensors.index.json"


class ExportError(RuntimeError):
    pass


def complete_export(export_dir: Path, checkpoint_dir: Path, out_dir: Path) -> list[Path]:
    """The export's top-level safetensors and index, plus the checkpoint's config and tokenizer files, in
    `out_dir` (staged, then renamed). torchtitan's `sharded/` duplicate is left out."""
    weights = sorted(p for p in export_dir.iterdir() if p.is_file() and p.suffix in EXPORT_SUFFIXES)
    if not any(p.suffix == ".safetensors" for p in weights):
        raise ExportError(f"{export_dir}: no safetensors files in the export")
    with staging_dir(out_dir) as staging:
        for path in weights:
            shutil.copy2(path, staging / path.name)
        for name in COMPANION_FILES:
            if (checkpoint_dir / name).exists():
                shutil.copy2(checkpoint_dir / name, staging / name)
        if not (staging / "config.json").exists():
            raise ExportError(f"{checkpoint_dir}: no config.json to complete the export with")
    return sorted(out_dir.iterdir())


def read_tensors(folder: Path) -> dict[str, Any]:
    """Every tensor in the folder's safetensors files (safetensors only: no pickle is ever loaded), each file's
    header checked before anything is read from it (safetensors_check)."""
    from safetensors import safe_open

    from ...safetensors_check import SafetensorsHeaderError, check_safetensors

    tensors: dict[str, Any] = {}
    for path in sorted(folder.glob("*.safetensors")):
        try:
            check_safetensors(path)
        except SafetensorsHeaderError as error:
            raise ExportError(f"not a safe safetensors file: {error}") from None
        with safe_open(path, "pt") as handle:
            for key in handle.keys():
                if key in tensors:
                    raise ExportError(f"{path}: tensor {key} is also in another file")
                tensors[key] = handle.get_tensor(key)
    return tensors


def index_problems(tensors: dict[str, Any], folder: Path) -> list[str]:
    """A sharded export's index must name exactly the tensors its files hold."""
    index_path = folder / INDEX_FILE
    if not index_path.exists():
        return [] if (folder / "model.safetensors").exists() else [f"{folder}: sharded weights without {INDEX_FILE}"]
    listed = set(json.loads(index_path.read_text()).get("weight_map", {}))
    problems = []
    if listed - tensors.keys():
        problems.append(f"{index_path}: index lists tensors the files lack: "
                        f"{', '.join(sorted(listed - tensors.keys()))}")
    if tensors.keys() - listed:
        problems.append(f"{index_path}: files hold tensors the index lacks: "
                        f"{', '.join(sorted(tensors.keys() - listed))}")
    return problems


def tensor_problems(tensors: dict[str, Any], tied: bool, source: Path) -> list[str]:
    import torch

    problems = index_problems(tensors, source) + [
        f"{source}: tensor {key} has non-finite values" for key, t in tensors.items()
        if t.is_floating_point() and not bool(torch.isfinite(t).all())
    ]
    if tied and TIED_HEAD in tensors:
        problems.append(f"{source}: config ties the embeddings but the files hold a separate {TIED_HEAD}")
    return problems


def shape_problems(tensors: dict[str, Any], folder: Path) -> list[str]:
    """Each tensor against the shape the model class built from config.json expects (on the meta device,
    so nothing is allocated): transformers' own error for a mismatch names no tensor."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder, trust_remote_code=False, local_files_only=True)
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in AutoModelForCausalLM.from_config(config).state_dict().items()}
    return [f"{folder}: tensor {key} has shape {tuple(t.shape)}, config.json's model expects {expected[key]}"
            for key, t in tensors.items() if key in expected and tuple(t.shape) != expected[key]]


def reload(folder: Path):
    """transformers' AutoModelForCausalLM from the completed folder: local files, safetensors, no remote code."""
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(
        folder, trust_remote_code=False, use_safetensors=True, local_files_only=True, output_loading_info=True,
    )
    return model.eval(), info


def loading_problems(info: dict[str, Any], folder: Path) -> list[str]:
    problems = []
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        found = sorted(str(k) for k in info.get(kind) or ())
        if found:
            problems.append(f"{folder}: reload {kind.replace('_', ' ')}: {', '.join(found)}")
    return problems


def tied_storage(model) -> bool:
    return model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def torchtitan_model(checkpoint_values: dict[str, Any], tensors: dict[str, Any], assets: Path):
    """torchtitan's own Qwen3 built from config.json, loaded from the export through torchtitan's
    state-dict adapter (from_hf): the model the native recipe trains, in its own code."""
    import torch
    from torchtitan.models.qwen3.state_dict_adapter import Qwen3StateDictAdapter

    from ...titan.models import native_model_from_checkpoint, use_sdpa

    config = native_model_from_checkpoint(checkpoint_values)
    use_sdpa(config)
    with torch.device("meta"):
        model = config.build()
    model.to_empty(device="cpu")
    state = Qwen3StateDictAdapter(config, str(assets)).from_hf(dict(tensors))
    if checkpoint_values["tie_word_embeddings"]:
        state.setdefault("lm_head.weight", state["tok_embeddings.weight"])
    with torch.no_grad():
        missing, unexpected = model.load_state_dict(state, strict=False, assign=False)
    missing = [k for k in missing if not k.endswith(("freqs_cis", "cache", "inv_freq"))]
    if missing or unexpected:
        raise ExportError(f"torchtitan's model does not take the export: missing {missing}, unexpected {unexpected}")
    if hasattr(model, "init_states"):
        _init_buffers(model)
    return model.eval()


def _init_buffers(model) -> None:
    """RoPE caches are buffers, not in the export: recompute them as torchtitan does after a meta build."""
    import torch

    for module in model.modules():
        if (hasattr(module, "init_states") and not list(module.parameters(recurse=False))
                and list(module.buffers(recurse=False))):
            with torch.no_grad():
                module.init_states(buffer_device=torch.device("cpu"))


def fixed_inputs(vocab_size: int, batch: int, seq_len: int, seed: int):
    import torch

    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, seq_len), generator=generator)


def compare_logits(hf_model, titan_model, tokens) -> dict[str, float]:
    import torch

    with torch.no_grad():
        hf_logits = hf_model(input_ids=tokens).logits.float()
        titan_logits = titan_model(tokens).float()
    return {
        "max_abs_diff": float((hf_logits - titan_logits).abs().max()),
        "argmax_agreement": float((hf_logits.argmax(-1) == titan_logits.argmax(-1)).float().mean()),
        "logits_max_abs": float(hf_logits.abs().max()),
    }


def greedy_generation(model, tokenizer_dir: Path, prompt: str, new_tokens: int) -> dict[str, Any]:
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, trust_remote_code=False, local_files_only=True)
    encoded = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        generated = model.generate(**encoded, max_new_tokens=new_tokens, do_sample=False)
    new = generated[0, encoded["input_ids"].shape[1]:]
    return {"prompt": prompt, "new_tokens": int(new.numel()), "text": tokenizer.decode(new, skip_special_tokens=True)}


def max_change(tensors: dict[str, Any], fetched: dict[str, Any]) -> float:
    """Largest elementwise change from the fetched weights, over the tensors both hold."""
    changes = [float((tensors[k].float() - fetched[k].float()).abs().max()) for k in tensors.keys() & fetched.keys()
               if tensors[k].shape == fetched[k].shape]
    return max(changes) if changes else math.nan


def check_export(
    *, recipe: str, export_dir: Path, checkpoint_dir: Path, out_dir: Path, settings: dict[str, Any], seed: int,
    fetched: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], list[str], list[Path]]:
    """One recipe's export: completed, reloaded, compared; returns its figures, its problems and its files.
    `fetched`: the checkpoint's tensors, when the caller has read them already (read here otherwise)."""
    from ...titan.parity import read_checkpoint_values

    checkpoint_values = read_checkpoint_values(checkpoint_dir)
    files = complete_export(export_dir, checkpoint_dir, out_dir)
    tensors = read_tensors(out_dir)
    problems = tensor_problems(tensors, checkpoint_values["tie_word_embeddings"], out_dir)
    problems += shape_problems(tensors, out_dir)
    if problems:  # transformers would stop on these with an error that names no tensor
        return {"tensors": len(tensors)}, problems, files
    model, info = reload(out_dir)
    problems += loading_problems(info, out_dir)
    tied = tied_storage(model)
    if checkpoint_values["tie_word_embeddings"] and not tied:
        problems.append(f"{out_dir}: config ties the embeddings but the reloaded lm_head has its own storage")
    figures: dict[str, Any] = {
        "tensors": len(tensors),
        "dtypes": sorted({str(t.dtype).removeprefix("torch.") for t in tensors.values()}),
        "tie_word_embeddings": checkpoint_values["tie_word_embeddings"],
        "lm_head_shares_embedding_storage": tied,
        "max_change_from_fetched": max_change(tensors, read_tensors(checkpoint_dir) if fetched is None else fetched),
    }
    if not figures["max_change_from_fetched"] > 0:
        problems.append(f"{out_dir}: the export equals the fetched weights: training changed nothing")
    if problems:  # a model that did not load cleanly is not compared
        return figures, problems, files
    titan = torchtitan_model(checkpoint_values, tensors, checkpoint_dir)
    tokens = fixed_inputs(checkpoint_values["vocab_size"], settings["batch"], settings["seq_len"], seed)
    logits = compare_logits(model, titan, tokens)
    # Held to export_reload.logits_tolerance and min_argmax_agreement by rule judge (logits_problems).
    figures["logits_vs_torchtitan"] = {**logits, "inputs": list(tokens.shape)}
    figures["generation"] = greedy_generation(model, out_dir, settings["prompt"], settings["new_tokens"])
    if figures["generation"]["new_tokens"] == 0:
        problems.append(f"{recipe}: greedy generation produced no tokens")
    return figures, problems, files


def key_set_problems(exports: dict[str, Path]) -> tuple[dict[str, Any], list[str]]:
    """The recipes' exports must hold the same tensors with the same dtypes and shapes."""
    from safetensors import safe_open

    layouts = {}
    for recipe, folder in exports.items():
        layout = {}
        for path in sorted(folder.glob("*.safetensors")):
            with safe_open(path, "pt") as handle:
                for key in handle.keys():
                    piece = handle.get_slice(key)
                    layout[key] = (piece.get_dtype(), tuple(piece.get_shape()))
        layouts[recipe] = layout
    (first, a), (second, b) = list(layouts.items())[:2]
    problems = []
    only_first, only_second = sorted(a.keys() - b.keys()), sorted(b.keys() - a.keys())
    if only_first or only_second:
        problems.append(f"export key sets differ: only in {first}: {only_first}; only in {second}: {only_second}")
    differing = sorted(k for k in a.keys() & b.keys() if a[k] != b[k])
    if differing:
        problems.append("export dtypes or shapes differ: " + ", ".join(f"{k} {a[k]} vs {b[k]}" for k in differing))
    return {"same_keys_and_dtypes": not problems, "keys": len(a)}, problems
