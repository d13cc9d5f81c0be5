"""The mutation check's list (tests/mutations/run.py, `make mutations`) against the code as it is: each line it
mutates is still there exactly once, so that an edit of the code under test breaks this fast test instead of
leaving `make mutations` to find it."""

from __future__ import annotations

import importlib.util
import sys

from conftest import PROJECT


def mutation_check():
    """tests/mutations/run.py as a module (a script, not a package module), registered as dataclasses need."""
    spec = importlib.util.spec_from_file_location("mutation_check", PROJECT / "tests" / "mutations" / "run.py")
    module = sys.modules.setdefault(spec.name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)
    return module


def test_each_mutant_changes_one_line_that_is_there_once():
    check = mutation_check()
    assert len(check.MUTANTS) >= 15
    for mutant in check.MUTANTS:
        text = check.mutated_path(mutant).read_text()
        assert text.count(mutant.line + "\n") == 1, (mutant.file, mutant.line)
        assert mutant.bug != mutant.line and "\n" not in mutant.bug, mutant.what


def test_a_file_a_killed_run_left_mutated_is_restored_from_its_copy(tmp_path, monkeypatch):
    check = mutation_check()
    monkeypatch.setattr(check, "PROJECT", tmp_path)
    monkeypatch.setattr(check, "BACKUPS", tmp_path / ".cache" / "mutations")
    code = tmp_path / "workflow" / "scripts" / "qwen3_pilot" / "audit.py"
    code.parent.mkdir(parents=True)
    code.write_text("mutated\n")
    backup = check.backup_of(code)
    backup.parent.mkdir(parents=True)
    backup.write_text("original\n")
    assert check.restore_leftovers() == [code]
    assert code.read_text() == "original\n" and not backup.exists()


def test_the_files_that_import_the_mutated_module_run_first_then_the_narrowest():
    """pytest stops at the first failure: the likeliest catchers go first (a test file that imports the mutated
    module itself, then those that reach the fewest package files), and no file that reaches it is left out."""
    check = mutation_check()
    target = "scripts/qwen3_pilot/artifacts.py"
    reach = {
        "tests/test_wide.py": check.Reach(frozenset(), (target, *(f"scripts/m{i}.py" for i in range(30)))),
        "tests/test_narrow.py": check.Reach(frozenset(), (target, "scripts/m1.py")),
        "tests/test_imports_it.py": check.Reach(frozenset({target}), (target, *(f"scripts/m{i}.py" for i in range(9)))),
        "tests/test_elsewhere.py": check.Reach(frozenset(), ("scripts/m1.py",)),
    }
    assert check.test_files_reaching(check.PROJECT / "workflow" / target, reach) == [
        "tests/test_imports_it.py", "tests/test_narrow.py", "tests/test_wide.py"]
