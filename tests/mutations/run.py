"""The mutation check (`make mutations`): each one-line bug in MUTANTS, applied to the code under test, must make
the suite's fast tier fail where it exercises the mutated file: every test file of the daily lane (`make test-fast`'s
markers) whose code reaches that file, by the same import closure that decides a stage's reruns
(qwen3_pilot.parse_time.code), not one test chosen for the bug. A mutant counts as caught when pytest reports a
failed test; a mutant it cannot apply, a selection that fails without the mutant, or a pytest that could not run
(a collection error, no test selected) is an error. Every file is restored, on success, failure and Ctrl-C; one a
killed run left mutated is restored from its copy under .cache/mutations/ before anything else runs.

    .venv/bin/python tests/mutations/run.py [--only SUBSTRING] [--list] [--after-passing-suite]
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
PACKAGE = Path("workflow/scripts/qwen3_pilot")
BACKUPS = PROJECT / ".cache" / "mutations"
FAST = "not (e2e or torchrun or slurm or chromium or netns)"  # the Makefile's FAST_TESTS


@dataclass(frozen=True)
class Mutant:
    what: str  # the bug, in words: which of the pilot's promises it breaks
    file: str  # relative to the package
    line: str  # the line as it is (it must occur once)
    bug: str  # the line with the bug


MUTANTS = (
    # ---- chain of custody ----
    Mutant("custody: a producer's recorded artifacts are never compared", "artifacts.py",
           '            if now != artifact["sha256"]:', '            if now != artifact["sha256"] and False:'),
    Mutant("custody: fetch_weights' manifest vouches for nothing (only summaries are producer records)",
           "artifacts.py", "    summaries = [p for p in consumed if p.name in PRODUCER_RECORDS]",
           '    summaries = [p for p in consumed if p.name == "summary.json"]'),
    Mutant("custody: the stage harness skips the check of its inputs", "stage_run.py",
           "            check_custody(self.consumes)", "            pass  # custody check skipped"),
    # ---- sign-off ----
    Mutant("sign-off binding: an edited report.html still counts as the signed-off report", "audit.py",
           '    if digests == (record["report_sha256"], record["report_html_sha256"]):',
           '    if digests[0] == record["report_sha256"]:'),
    Mutant("sign-off: a report with stages that did not run can be approved", "audit.py",
           '        if report.get("failed_run") or report["status"] != "pass":',
           '        if report.get("failed_run"):'),
    # ---- the baseline ----
    Mutant("baseline: an approval of another backend's run is the baseline", "changes.py",
           '                 if record["decision"] == "approve" and signoff_backend(record, signoffs) == backend]',
           '                 if record["decision"] == "approve"]'),
    Mutant("baseline: the first approval instead of the last", "changes.py",
           "    record = approvals[-1]", "    record = approvals[0]"),
    # ---- failure propagation ----
    Mutant("blocked: a failure blocks only the stages that read it directly", "stages/__init__.py",
           "    while grown := {name for name, upstream in UPSTREAM.items() if {stage, *found} & set(upstream)}"
           " - found:",
           "    while grown := {name for name, upstream in UPSTREAM.items() if {stage} & set(upstream)} - found:"),
    # ---- rerun sets ----
    Mutant("config edits: the native flavor is in every recipe's params (an edit retrains train_hf too)",
           "parse_time/config.py", '    if "train_native" in stages:', "    if True:"),
    Mutant("code edits: a docstring edit changes a stage's code digest (reruns it)", "parse_time/code.py",
           "                node.body = body[1:] or [ast.Pass()]", "                pass"),
    Mutant("code edits: the code the ranks run (started by name) is not in the stage's digest", "parse_time/code.py",
           "            named.add(node.value)  # a module started by name (python -m, torchrun, --module)",
           "            pass"),
    Mutant("SDK components: the fork is not pinned (checking out another fork commit reruns nothing)",
           "backends/neuron/stack/installed.py",
           "    versions = {**stack.pip_packages, stack.fork.distribution: stack.fork.version}",
           "    versions = dict(stack.pip_packages)"),
    # ---- the gates ----
    Mutant("gate: the loaded-weights gap compared with 0, not training.gate.min_gap", "stages/train_judging.py",
           '    if not control - loaded >= gate["min_gap"]:', "    if not control - loaded >= 0:"),
    Mutant("gate: the recipes' step-1 losses agree whatever their difference", "stages/compare_recipes.py",
           "    if not difference <= tolerance:", "    if not difference <= tolerance or True:"),
    Mutant("gate: the export's logits pass whatever their difference", "stages/export_reload_judging.py",
           '    if not logits["max_abs_diff"] <= judging["logits_tolerance"]:',
           '    if not logits["max_abs_diff"] <= judging["logits_tolerance"] + 1e9:'),
    # ---- the kernels ----
    Mutant("kernels: RoPE rotates the wrong half", "titan/kernels/rope.py",
           "    return torch.cat((-x2, x1), dim=-1)", "    return torch.cat((x2, -x1), dim=-1)"),
    Mutant("kernels: two replacements in one layer pass the launch-log count", "titan/kernels/__init__.py",
           "        repeated = {layer: paths for layer, paths in per_layer.items() if len(paths) > 1}",
           "        repeated = {layer: paths for layer, paths in per_layer.items() if len(paths) > 2}"),
    Mutant("kernels: the NKI RoPE kernel launches a sequence off its grid (no check before the launch)",
           "backends/neuron/nki_rope.py", "        check_seq_len(q.shape[2], lnc)", "        pass  # no check"),
    Mutant("config: a trn2 seq_len the NKI RoPE kernel cannot take passes the parse-time check",
           "backends/neuron/config_rules.py", "        if seq_len % multiple:", "        if seq_len % 128:"),
    Mutant("the CPU peak 10x off (MFU's denominator)", "backends/cpu.py",
           "    return 2 * size**3 * calls / elapsed", "    return 20 * size**3 * calls / elapsed"),
    Mutant("the report: the plain-kernel control drawn from the replaced run's losses", "plots.py",
           '            curves[plain] = [(s["step"], s["loss_plain"]) for s in replacements["against_plain"]["steps"]]',
           '            curves[plain] = [(s["step"], s["loss_replaced"]) for s in '
           'replacements["against_plain"]["steps"]]'),
)


def mutated_path(mutant: Mutant) -> Path:
    return PROJECT / PACKAGE / mutant.file


def backup_of(path: Path) -> Path:
    return BACKUPS / path.relative_to(PROJECT)


def restore_leftovers() -> list[Path]:
    """Files a killed run left mutated, put back from their copies."""
    restored = []
    for backup in sorted(BACKUPS.rglob("*.py")) if BACKUPS.is_dir() else []:
        target = PROJECT / backup.relative_to(BACKUPS)
        shutil.copy2(backup, target)
        backup.unlink()
        restored.append(target)
    return restored


@dataclass(frozen=True)
class Reach:
    """The package files (relative to workflow/) a test file imports itself, and all those its code can run
    (parse_time.code.stage_code's import closure)."""

    imported: frozenset[str]
    closure: tuple[str, ...]


def test_file_reach() -> dict[str, Reach]:
    sys.path.insert(0, str(PROJECT / "workflow" / "scripts"))
    from qwen3_pilot.parse_time.code import CodeCache, stage_code

    cache = CodeCache()
    return {str(test.relative_to(PROJECT)): Reach(
        frozenset(path.relative_to(PROJECT / "workflow").as_posix() for path in cache.module(test).runs()),
        stage_code(test, "cpu", cache).files) for test in sorted((PROJECT / "tests").rglob("test_*.py"))}


def test_files_reaching(path: Path, reach: dict[str, Reach]) -> list[str]:
    """The test files whose closure holds `path`, in the order pytest runs them: those that import it themselves
    first, then by how few package files they reach (the unit tests of the mutated file before the tests of what
    builds on it). pytest stops at the first failure (-x), so a caught mutant costs only the tests before the first
    one that catches it; which test catches it decides nothing."""
    target = path.relative_to(PROJECT / "workflow").as_posix()
    return sorted((test for test, of_test in reach.items() if target in of_test.closure),
                  key=lambda test: (target not in reach[test].imported, len(reach[test].closure), test))


def pytest(files: list[str]) -> subprocess.CompletedProcess:
    # -x: the first failure decides; -rf: its name in the summary (pyproject's -rs lists only skips).
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-rf", "-p", "no:cacheprovider", "-m", FAST, *files]
    return subprocess.run(command, cwd=PROJECT, capture_output=True, text=True)


def run_mutant(mutant: Mutant, files: list[str]) -> str:
    path = mutated_path(mutant)
    text = path.read_text()
    if text.count(mutant.line + "\n") != 1:
        return f"ERROR     {mutant.file}: the line to mutate is not there exactly once: {mutant.line.strip()!r}"
    backup = backup_of(path)
    backup.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(path, backup)
    try:
        path.write_text(text.replace(mutant.line + "\n", mutant.bug + "\n"))
        result = pytest(files)
    finally:
        shutil.copy2(backup, path)
        backup.unlink()
    if result.returncode == 1:
        failed = next((line for line in result.stdout.splitlines() if line.startswith("FAILED ")), "a test failed")
        return f"caught    {mutant.what}: {failed.removeprefix('FAILED ').split(' - ')[0]}"
    if result.returncode == 0:
        return f"SURVIVED  {mutant.what} ({mutant.file}; {len(files)} test files passed)"
    return f"ERROR     {mutant.what}: pytest exited {result.returncode}: {result.stdout.strip()[-300:]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="the mutants whose description or file contains this")
    parser.add_argument("--list", action="store_true", help="list the mutants and the test files each runs")
    parser.add_argument("--after-passing-suite", action="store_true",
                        help="skip the unmutated run of the selections: the whole suite has just passed on this "
                             "tree (CI runs this check right after `make test`)")
    args = parser.parse_args(argv)
    # SIGTERM (a CI timeout, kill) unwinds like Ctrl-C, through the restoring `finally`.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    for path in restore_leftovers():
        print(f"restored  {path.relative_to(PROJECT)} (left mutated by an interrupted run)")
    mutants = [m for m in MUTANTS if not args.only or args.only in m.what or args.only in m.file]
    reach = test_file_reach()
    selections = {m: test_files_reaching(mutated_path(m), reach) for m in mutants}
    if args.list:
        for mutant, files in selections.items():
            print(f"{mutant.file}: {mutant.what}\n    " + " ".join(files))
        return 0
    # The selections pass as the code is: a test that fails anyway catches nothing. (After a passing suite they did,
    # all of them: its fast tier is what they select from.)
    if not args.after_passing_suite:
        everything = sorted({file for files in selections.values() for file in files})
        baseline = pytest(everything)
        if baseline.returncode != 0:
            print(f"BROKEN    the fast tests fail without any mutant:\n{baseline.stdout[-3000:]}")
            return 1
    lines = []
    for mutant in mutants:
        if not selections[mutant]:
            lines.append(f"ERROR     {mutant.what}: no fast test file reaches {mutant.file}")
        else:
            lines.append(run_mutant(mutant, selections[mutant]))
        print(lines[-1], flush=True)
    caught = sum(line.startswith("caught") for line in lines)
    print(f"{caught} of {len(mutants)} mutants caught")
    return 0 if caught == len(mutants) else 1


if __name__ == "__main__":
    sys.exit(main())
