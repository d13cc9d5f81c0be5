"""Stage fetch_weights: the checkpoint through huggingface_hub, every file checked against the hub's checksums."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .weights import fetch_weights


def run(
    *,
    weights: dict[str, Any],
    cache_dir: Path,
    offline: bool,
    backend: str,
    out_dir: Path,
    manifest_path: Path,
    summary_path: Path,
) -> dict[str, Any]:
    from ...artifacts import write_recorded_json
    from ...summary import StageSummary

    manifest = fetch_weights(
        repo_id=weights["repo_id"],
        revision=weights["revision"],
        cache_dir=cache_dir,
        allow_patterns=weights["allow_patterns"],
        offline=offline,
        out_dir=out_dir,
    )
    fixture = weights["source"] == "fixture"
    checkpoint_files = [
        {"path": f"{out_dir}/{f['path']}", "bytes": f["bytes"], "sha256": f["sha256"]} for f in manifest["files"]
    ]
    # The content record the consumers read (artifacts.PRODUCER_RECORDS): the same bytes whenever the same
    # files are fetched, so a refetch that changes none reruns no consumer (workflow/rules/common.smk,
    # get_fetched_weights). Nothing about this run goes in it.
    write_recorded_json(manifest_path, {"stage": "fetch_weights", **manifest, "fixture": fixture,
                                        "artifacts": checkpoint_files})
    notes = []
    if fixture:
        notes.append(
            "FIXTURE: these are the pipeline's own tiny Qwen3 weights, published into an offline hub cache, "
            "not the published Qwen weights."
        )
    if not manifest["revision_pinned"]:
        notes.append(
            f"UNPINNED: revision {weights['revision']!r} is a branch or tag name; it resolved to "
            f"{manifest['resolved_commit']} this time. Set weights.revision to that commit to pin it."
        )
    summary = StageSummary(
        stage="fetch_weights",
        status="pass",
        backend=backend,
        figures={
            "repo_id": manifest["repo_id"],
            "revision": manifest["revision"],
            "resolved_commit": manifest["resolved_commit"],
            "revision_pinned": manifest["revision_pinned"],
            "files": len(manifest["files"]),
            "skipped": manifest["skipped"],
            "safetensors_tensors": manifest["safetensors_tensors"],
            "parameters_stored": manifest["parameters_stored"],
            "fixture": fixture,
        },
        proves="Every fetched file matches the checksum the hub cache holds for it, every safetensors file "
        "parses and reads in full, and no pickle or code file was fetched.",
        does_not_prove="That the weights are good, or that they load into the recipes' models (the training "
        "stages' loaded-weights gate checks that)"
        + ("; and these are fixture weights, not the published Qwen3." if fixture else "."),
        notes=notes,
    )
    summary.artifacts = list(checkpoint_files)
    summary.add_artifacts([manifest_path])
    return summary.write(summary_path)
