"""No secret in the environment reaches a file: the shared run ran with dummy HF_TOKEN and AWS keys set
(conftest.DUMMY_SECRETS), and an archive of it runs with them here; every file either wrote is searched for each
value (the run's results, logs, launch records, rank logs, Snakemake's own logs and metadata, the report, the
archive's copies and manifest)."""

from __future__ import annotations

from pathlib import Path

from conftest import DUMMY_SECRETS, output, run_snakemake, set_archive, venv_env


def secrets_in(roots: list[Path]) -> list[tuple[str, str]]:
    """(file, variable) for each file under `roots` holding a dummy secret's value."""
    found = []
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                data = path.read_bytes()
                found += [(str(path), name) for name, value in DUMMY_SECRETS.items() if value.encode() in data]
    return found


def test_the_search_finds_a_secret_where_one_was_written(tmp_path):
    (tmp_path / "nested").mkdir()
    (tmp_path / "nested" / "launch.json").write_text(f'{{"env": {{"HF_TOKEN": "{DUMMY_SECRETS["HF_TOKEN"]}"}}}}')
    assert secrets_in([tmp_path]) == [(str(tmp_path / "nested" / "launch.json"), "HF_TOKEN")]


def test_no_secret_from_the_environment_reaches_a_file_the_run_or_its_archive_wrote(copy_of_run, tmp_path):
    destination = tmp_path / "archive"
    destination.mkdir()
    set_archive(copy_of_run, destination=str(destination))
    result = run_snakemake(copy_of_run, "--cores", "1", "archive", env=venv_env(**DUMMY_SECRETS))
    assert result.returncode == 0, output(result)[-3000:]
    assert any(destination.rglob("report.json"))  # the archive copied the run
    assert secrets_in([copy_of_run, destination]) == []
