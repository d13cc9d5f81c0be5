"""The weights (what stage fetch_weights fetches): a Hugging Face snapshot at a revision, allow-listed files
only, every file checked against the checksum the hub gave for it, every safetensors file parsed, and a
manifest.

The same code serves the real hub (trn2) and the cpu fixture, which is published into an offline hub
cache first so that this path runs on machines without internet.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
from pathlib import Path
from typing import Any

from ...artifacts import sha256_file, staging_dir, verify_checksum
from ...parse_time.config import is_pinned_revision

# Pickle-based formats can run code when loaded, and code files are what trust_remote_code would run:
# none of them is fetched, whatever allow_patterns says.
REFUSED_PATTERNS = ("*.bin", "*.pt", "*.pth", "*.pkl", "*.pickle", "*.ckpt", "*.h5", "*.msgpack", "*.py")
REQUIRED_FILES = ("config.json",)


class WeightsError(RuntimeError):
    pass


def _matches(name: str, patterns: tuple[str, ...] | list[str]) -> bool:
    return any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(Path(name).name, p) for p in patterns)


def download_snapshot(repo_id: str, revision: str, cache_dir: Path, allow_patterns: list[str], offline: bool) -> Path:
    """huggingface_hub's snapshot download into `cache_dir`; returns the snapshot folder (named by commit)."""
    from huggingface_hub import snapshot_download

    allowed = [p for p in allow_patterns if not _matches(p, REFUSED_PATTERNS)]
    return Path(
        snapshot_download(
            repo_id=repo_id,
            revision=revision,
            cache_dir=str(cache_dir),
            allow_patterns=allowed,
            ignore_patterns=list(REFUSED_PATTERNS),
            local_files_only=offline,
        )
    )


def hub_checksum(snapshot_file: Path) -> str:
    """The etag the hub served for a cached file: the blob's name (sha256 for LFS, git sha1 otherwise)."""
    if not snapshot_file.is_symlink():
        raise WeightsError(f"{snapshot_file}: not a hub-cache symlink, so there is no hub checksum to check")
    return Path(os.readlink(snapshot_file)).name


def verify_safetensors(path: Path) -> dict[str, Any]:
    """Checks the header (safetensors_check: before anything is read), then reads every tensor, so hostile,
    truncated or garbled files fail here, named."""
    from safetensors import SafetensorError, safe_open

    from ...safetensors_check import SafetensorsHeaderError, check_safetensors

    try:
        check_safetensors(path)
    except SafetensorsHeaderError as error:
        raise WeightsError(f"not a safe safetensors file: {error}") from None
    try:
        with safe_open(str(path), framework="pt") as handle:
            names = list(handle.keys())
            numel = 0
            dtypes: set[str] = set()
            for name in names:
                tensor = handle.get_tensor(name)
                numel += tensor.numel()
                dtypes.add(str(tensor.dtype).removeprefix("torch."))
    except (SafetensorError, OSError, ValueError, RuntimeError) as error:
        raise WeightsError(f"{path.name}: not a readable safetensors file: {error}") from error
    return {"tensors": names, "numel": numel, "dtypes": sorted(dtypes)}


def check_index(folder: Path, tensors_by_file: dict[str, list[str]]) -> None:
    index = folder / "model.safetensors.index.json"
    if not index.exists():
        return
    weight_map = json.loads(index.read_text())["weight_map"]
    for tensor, filename in weight_map.items():
        if tensor not in tensors_by_file.get(filename, []):
            raise WeightsError(f"model.safetensors.index.json: tensor {tensor} not found in {filename}")


def fetch_weights(
    *,
    repo_id: str,
    revision: str,
    cache_dir: Path,
    allow_patterns: list[str],
    offline: bool,
    out_dir: Path,
) -> dict[str, Any]:
    """Fetches, verifies and copies the snapshot into `out_dir` (atomically); returns the manifest."""
    snapshot = download_snapshot(repo_id, revision, cache_dir, allow_patterns, offline)
    commit = snapshot.name
    files, skipped = [], []
    tensors_by_file: dict[str, list[str]] = {}
    totals = {"tensors": 0, "numel": 0}
    with staging_dir(out_dir) as checkpoint:
        for source in sorted(p for p in snapshot.rglob("*") if p.is_file()):
            name = source.relative_to(snapshot).as_posix()
            if _matches(name, REFUSED_PATTERNS) or not _matches(name, allow_patterns):
                skipped.append(name)
                continue
            expected = hub_checksum(source)
            kind = verify_checksum(source, expected)
            target = checkpoint / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
            entry = {"path": name, "bytes": target.stat().st_size, "sha256": sha256_file(target),
                     "hub_checksum": expected, "hub_checksum_kind": kind}
            if name.endswith(".safetensors"):
                info = verify_safetensors(target)
                tensors_by_file[name] = info["tensors"]
                entry.update(tensors=len(info["tensors"]), dtypes=info["dtypes"])
                totals["tensors"] += len(info["tensors"])
                totals["numel"] += info["numel"]
            files.append(entry)
        present = {f["path"] for f in files}
        for required in REQUIRED_FILES:
            if required not in present:
                raise WeightsError(f"{repo_id}@{revision}: {required} missing from the snapshot")
        if not tensors_by_file:
            raise WeightsError(f"{repo_id}@{revision}: no *.safetensors file in the snapshot")
        check_index(checkpoint, tensors_by_file)
        config = json.loads((checkpoint / "config.json").read_text())
        if config.get("auto_map"):
            skipped.append("config.json:auto_map (remote code is never run)")
    return {
        "repo_id": repo_id,
        "revision": revision,
        "resolved_commit": commit,
        "revision_pinned": is_pinned_revision(revision),
        "files": files,
        "skipped": skipped,
        "safetensors_tensors": totals["tensors"],
        "parameters_stored": totals["numel"],
        "model_type": config.get("model_type"),
        "architectures": config.get("architectures"),
    }
