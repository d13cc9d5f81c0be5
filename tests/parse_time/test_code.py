"""The code digest that decides a stage's rerun (parse_time/code.py): what it counts as a change, which files
make up a stage's code, and its cache between processes. The dry runs it decides: tests/e2e/test_reruns.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qwen3_pilot.parse_time import code
from qwen3_pilot.parse_time.code import CodeCache, parse_module, stage_code
from qwen3_pilot.paths import SCRIPTS

MODULE = b'''"""A module."""
import json

LIMIT = 3  # a comment


def check(value):
    """Whether value is under LIMIT."""
    from .other import helper
    return helper(value) < LIMIT
'''


def digest(source: bytes) -> str:
    return parse_module(source, "m.py", "qwen3_pilot.stages.m", False).digest


def test_comments_docstrings_and_layout_change_no_digest():
    reworded = (MODULE.replace(b"# a comment", b"# another comment, longer")
                .replace(b'"""Whether value is under LIMIT."""', b'"""Reworded:\n    over two lines."""')
                .replace(b"LIMIT = 3", b"LIMIT = (\n    3\n)"))
    assert digest(reworded) == digest(MODULE)
    # A function that is nothing but its docstring stays a function (its body becomes `pass`).
    assert digest(b'def f():\n    """Doc."""\n') == digest(b'def f():\n    """Other doc."""\n')


@pytest.mark.parametrize("edit", [(b"LIMIT = 3", b"LIMIT = 4"), (b"< LIMIT", b"<= LIMIT"),
                                  (b"import json", b"import json as js")])
def test_a_changed_statement_name_or_constant_changes_the_digest(edit):
    assert digest(MODULE.replace(*edit)) != digest(MODULE)


def test_what_a_module_names_resolves_relative_imports_and_modules_started_by_name():
    source = (b"from ..training import read_steps\nfrom . import judge\nimport os\n"
              b"def f():\n    from .kernel_numerics import judging\n"
              b"COMMAND = ['-m', 'qwen3_pilot.titan.in_ranks.train_entry']\n")
    names = parse_module(source, "m.py", "qwen3_pilot.stages.m", False).names
    assert {"qwen3_pilot.training", "qwen3_pilot.stages.judge", "qwen3_pilot.stages.kernel_numerics.judging",
            "qwen3_pilot.titan.in_ranks.train_entry", "qwen3_pilot.titan.in_ranks", "qwen3_pilot"} <= set(names)
    assert not any(name.startswith("os") for name in names)
    # In a package's __init__, one dot is the package itself.
    package = parse_module(b"from .comparison import x\n", "__init__.py", "qwen3_pilot.stages.kernel_numerics", True)
    assert "qwen3_pilot.stages.kernel_numerics.comparison" in package.names


def files_of(script: str, backend: str = "cpu") -> set[str]:
    return set(stage_code(SCRIPTS / script, backend).files)


def test_a_training_stage_runs_its_ranks_code_and_the_configured_backend_and_no_judging():
    files = files_of("train.py")
    assert {"scripts/train.py", "scripts/qwen3_pilot/training.py",
            "scripts/qwen3_pilot/titan/in_ranks/train_entry.py",  # started by name in torchrun's command
            "scripts/qwen3_pilot/titan/in_ranks/recipes.py",  # the trainer's --module
            "scripts/qwen3_pilot/backends/cpu.py"} <= files
    neuron = "scripts/qwen3_pilot/backends/neuron/"
    assert not [path for path in files if path.startswith(neuron)]
    # The package and the module whose kernels its trainer processes install.
    assert {neuron + "__init__.py", neuron + "in_process.py"} <= files_of("train.py", "neuron")


def test_no_measuring_stage_runs_judging_code():
    """Judging is written apart so that a judge edit re-judges without measuring: no measuring stage's code may
    hold a judging module, and the judge's holds each."""
    judging = {path.relative_to(SCRIPTS.parent).as_posix() for path in SCRIPTS.glob("qwen3_pilot/stages/**/*.py")
               if path.stem.endswith("judging")}
    assert len(judging) == 7
    for script in ("train.py", "moe_reduced.py", "export_reload.py", "kernel_numerics.py", "benchmark.py"):
        assert not files_of(script) & judging, script
    assert judging <= files_of("judge.py")


def test_the_cache_keeps_each_files_code_by_its_bytes_for_the_next_process(tmp_path, monkeypatch):
    path = tmp_path / "code_digests.json"
    first = stage_code(SCRIPTS / "judge.py", "cpu", CodeCache(path))
    assert path.is_file()

    def parse_again(*args):
        raise AssertionError("parsed a file the cache holds")

    monkeypatch.setattr(code, "parse_module", parse_again)
    assert stage_code(SCRIPTS / "judge.py", "cpu", CodeCache(path)) == first
    # A damaged cache is rebuilt, not trusted.
    path.write_text("{not json")
    monkeypatch.undo()
    assert stage_code(SCRIPTS / "judge.py", "cpu", CodeCache(path)) == first
    assert json.loads(path.read_text())


def test_a_file_with_other_bytes_is_parsed_again(tmp_path):
    script = tmp_path / "stage.py"
    script.write_text("import json\nX = 1\n")
    cache = CodeCache(tmp_path / "cache.json")
    before = stage_code(script, "cpu", cache).digest
    script.write_text("import json\nX = 2\n")
    assert stage_code(script, "cpu", CodeCache(tmp_path / "cache.json")).digest != before
    assert Path(tmp_path / "cache.json").is_file()
