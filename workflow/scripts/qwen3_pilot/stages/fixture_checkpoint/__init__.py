"""Stage fixture_checkpoint (cpu backend): the tiny Qwen3 checkpoint, published as an offline hub cache.

- build.py: the model's config, its pretraining, and the build of the whole fixture;
- tokenizer.py: its tokenizer, trained on the corpus and saved as Qwen's are;
- hub_cache.py: the files laid out as huggingface_hub's cache.
"""

from __future__ import annotations

from pathlib import Path

from .build import FIXTURE_NOTE, FixtureArchitecture, build_fixture


def run(
    *, corpus_dir: Path, fixture: dict, repo_id: str, revision: str, backend: str, out_dir: Path, summary_path: Path
) -> dict:
    from ...summary import StageSummary

    architecture, settings = FixtureArchitecture.split(fixture)
    built = build_fixture(corpus_dir / "data.json", out_dir, repo_id=repo_id, revision=revision,
                          architecture=architecture, **settings)
    figures = {k: v for k, v in built.items() if k not in ("losses", "note")}
    figures["loss_gap"] = built["init_loss"] - built["final_loss"]
    summary = StageSummary(
        stage="fixture_checkpoint",
        status="pass",
        backend=backend,
        figures=figures,
        proves=(
            f"A tiny Qwen3 (GQA, qk-norm, tied embeddings, head_dim {built['head_dim']}) pretrained for "
            f"{built['steps']} steps on the corpus reaches a held-out loss of {built['final_loss']:.3f}, against "
            f"{built['init_loss']:.3f} at random init; it was published into an offline hub cache that "
            "huggingface_hub resolves."
        ),
        does_not_prove="Anything about the published Qwen3 weights: this is a fixture that stands in for them.",
        notes=[FIXTURE_NOTE],
    )
    summary.add_artifacts([p for p in sorted((out_dir / "published").iterdir()) if p.is_file()])
    return summary.write(summary_path)
