"""A folder of files laid out as huggingface_hub's cache of a repository at a revision, as a real download lays it
out: the fixture is fetched from there as the published weights are from the hub."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

# What the hub's default .gitattributes stores in LFS (plus anything over 10 MiB). For these the
# hub's etag, and so the blob's name in the cache, is the content's sha256; for the rest it is
# the git blob sha1.
LFS_SUFFIXES = {".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".model"}
LFS_MIN_BYTES = 10 * 1024 * 1024


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
