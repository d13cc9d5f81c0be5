"""The recipes on other torchtitans: recipe x torchtitan -> works / fails (why).

    python -m qwen3_pilot.tools.titan_compat [--torchtitan LABEL=PATH ...] [--steps 2] [--out FILE.md]
    (make titan-compat TORCHTITANS="LABEL=PATH ...")

For the installed torchtitan and each PATH (a folder holding a `torchtitan` package, e.g. `git archive <commit>
torchtitan | tar -x -C PATH`, or a wheel), on this interpreter's torch: first whether it can run any recipe at all
(titan_api.config_api_problem: releases before upstream's config refactor cannot), then each recipe's own API
check (titan_api: the names that recipe uses, from any of their known homes), then, when both pass, the recipe's
recorded trainer launch of the finished cpu run in this folder (results/<stage>/run/launch.json, tiny widths, 2
gloo ranks) again for `--steps` steps with that torchtitan first on the ranks' import path (training.relaunch).
The tiny models, corpus and checkpoint are the run's; nothing here downloads.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from ..paths import SCRIPTS, RunFolder
from ..recipe_registry import RECIPES, Recipe

INSTALLED = "installed"


@dataclass(frozen=True)
class Torchtitan:
    label: str
    path: Path | None  # None: the installed one

    def import_path(self) -> dict[str, str]:
        """The environment that puts this torchtitan first on the import path (nothing for the installed one)."""
        if self.path is None:
            return {}
        return {"PYTHONPATH": os.pathsep.join([str(self.path), str(SCRIPTS), os.environ.get("PYTHONPATH", "")])}


def unpacked(torchtitan: Torchtitan, scratch: Path) -> Torchtitan:
    """A wheel unpacked into `scratch` (a wheel is a zip of the packages); a folder as it is."""
    if torchtitan.path is None or torchtitan.path.is_dir():
        return torchtitan
    folder = scratch / f"{torchtitan.label}-unpacked"
    with zipfile.ZipFile(torchtitan.path) as archive:
        archive.extractall(folder)
    return Torchtitan(torchtitan.label, folder)


# Run with the torchtitan under test first on the path: its version, the refusal, each recipe's missing names on
# the cpu backend (the relaunches here), and each user's on neuron (what the preflight's fork check needs on a trn2).
_API_PROBE = """
import json
from qwen3_pilot.titan import api_levels, api_names, titan_api
refused = titan_api.config_api_problem()
missing = {} if refused else {r: titan_api.missing_api(backend="cpu", user=r) for r in api_names.RECIPES}
import torchtitan
print(json.dumps({"version": titan_api.installed_torchtitan(), "file": torchtitan.__file__, "refused": refused,
                  "level": None if refused else api_levels.installed_level(), "missing": missing,
                  "missing_on_neuron": {} if refused else titan_api.missing_by_user("neuron")}))
"""


def api_probe(torchtitan: Torchtitan, run: Callable[..., subprocess.CompletedProcess] = subprocess.run
              ) -> dict[str, Any]:
    """What _API_PROBE finds in `torchtitan`, asked once per process (it imports torchtitan: about 8 CPU-seconds,
    and the preflight's fork check and the fork's launches both read it), through `run` (subprocess.run; a test's
    own, never by patching the module: the suite runs other tests' bodies in threads meanwhile)."""
    return copy.deepcopy(_probed(torchtitan, run))


@functools.cache
def _probed(torchtitan: Torchtitan, run: Callable[..., subprocess.CompletedProcess]) -> dict[str, Any]:
    result = run([sys.executable, "-c", _API_PROBE], capture_output=True, text=True,
                 env={**os.environ, **torchtitan.import_path()}, timeout=600)
    if result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return {"version": "unknown", "refused": f"the API check could not run: {tail}", "level": None,
                "missing": {}, "missing_on_neuron": {}}
    probe = json.loads(result.stdout.strip().splitlines()[-1])
    expected = (torchtitan.path / "torchtitan") if torchtitan.path else None
    if expected is not None and not probe["file"].startswith(str(expected)):
        probe["refused"] = f"imported {probe['file']}, not the torchtitan under {torchtitan.path}"
    return probe


def train(workdir: Path, torchtitan: Torchtitan, recipe: Recipe, steps: int, scratch: Path) -> dict[str, Any]:
    """The recipe's recorded launch again for `steps` steps on this torchtitan: the cell {works, why (why not, or
    the losses), losses (as logged, in the JSON)}."""
    from ..training import read_steps, relaunch

    folder = scratch / torchtitan.label / recipe.config_function
    launch = relaunch(workdir, recipe.stage, "run", folder, added_env=torchtitan.import_path(),
                      recipe_changes={"steps": steps, "warmup_steps": 1})
    if launch.returncode != 0:
        error = launch.rank_error() or (launch.output().strip().splitlines() or ["no output"])[-1]
        why = f"the trainer failed: {error.splitlines()[-1] if error else 'no error recorded'}"[:400]
        return {"works": False, "why": why}
    losses = [step["loss"] for step in read_steps(folder / "run" / "metrics.jsonl")]
    if len(losses) != steps:
        return {"works": False, "why": f"{len(losses)} of {steps} steps logged", "losses": losses}
    return {"works": True, "why": "trained " + ", ".join(f"{loss:.3f}" for loss in losses), "losses": losses}


def row(workdir: Path, torchtitan: Torchtitan, steps: int, scratch: Path, *, probed: Callable | None = None,
        trained: Callable | None = None) -> dict[str, Any]:
    """One torchtitan: per recipe (by its config function) 'works' or 'fails', and why; `probed` and `trained` stand
    for api_probe and train where a test hands in its own."""
    probe = (probed or api_probe)(torchtitan)
    cells = {}
    for recipe in RECIPES:
        name = recipe.config_function
        if probe["refused"]:
            cells[name] = {"works": False, "why": f"refused: {probe['refused']}"}
        elif probe["missing"].get(name):
            names = probe["missing"][name]
            cells[name] = {"works": False, "why": f"{len(names)} name(s) missing: " + "; ".join(
                without_reason(name) for name in names[:3]) + ("; ..." if len(names) > 3 else "")}
        else:
            cells[name] = (trained or train)(workdir, torchtitan, recipe, steps, scratch)
    return {"torchtitan": torchtitan.label, "version": probe["version"], "level": probe["level"], "recipes": cells}


def without_reason(message: str) -> str:
    """A missing-name message without the "(who uses it)" it ends with (titan_api), for a table cell: the JSON
    keeps it."""
    if not message.endswith(")"):
        return message
    depth = 0
    for at in range(len(message) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(message[at], 0)
        if depth == 0:
            return message[:at].rstrip()
    return message


def missing_launches(workdir: Path) -> str | None:
    """What the finished run in `workdir` lacks for a relaunch (train): the training stages without a recorded
    launch (results/<stage>/run/launch.json), said with the command that makes them; None when it has every one."""
    missing = [recipe.stage for recipe in RECIPES
               if not RunFolder(workdir).launch_record(recipe.stage, "run").is_file()]
    if not missing:
        return None
    return (f"{workdir}: no recorded launch for {', '.join(missing)} (results/<stage>/run/launch.json): run the cpu "
            "pipeline here first (make report)")


def matrix(workdir: Path, torchtitans: list[Torchtitan], steps: int) -> list[dict[str, Any]]:
    if missing := missing_launches(workdir):
        raise SystemExit(missing)
    with tempfile.TemporaryDirectory(prefix="titan-compat-") as scratch:
        return [row(workdir, unpacked(t, Path(scratch)), steps, Path(scratch)) for t in torchtitans]


def markdown(rows: list[dict[str, Any]], steps: int) -> str:
    lines = [f"Measured {date.today().isoformat()} with `python -m qwen3_pilot.tools.titan_compat` ({steps} steps per "
             "recipe, tiny widths, 2 gloo ranks, torch " + _torch_version() + ").", "",
             "| torchtitan | version | API level | " + " | ".join(recipe.config_function for recipe in RECIPES) + " |",
             "|---|---|---|" + "---|" * len(RECIPES)]
    for entry in rows:
        cells = [("works" if c["works"] else "fails") + f": {c['why']}" for c in entry["recipes"].values()]
        lines.append(f"| {entry['torchtitan']} | {entry['version']} | {entry['level'] or '-'} | " + " | ".join(
            cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def _torch_version() -> str:
    from importlib.metadata import version

    return version("torch")


def parse_torchtitan(text: str) -> Torchtitan:
    label, sep, path = text.partition("=")
    if not sep or not label or not Path(path).exists():
        raise argparse.ArgumentTypeError(f"{text!r}: expected LABEL=PATH with an existing folder or wheel")
    return Torchtitan(label, Path(path).resolve())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qwen3_pilot.tools.titan_compat",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--torchtitan", type=parse_torchtitan, action="append", default=[],
                        help="LABEL=PATH: a folder holding a torchtitan package, or a wheel (repeatable)")
    parser.add_argument("--no-installed", action="store_true", help="leave out the installed torchtitan")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=Path.cwd(), help="a finished cpu run (default: here)")
    parser.add_argument("--out", type=Path, help="also write the table (markdown) and the rows (.json beside it)")
    args = parser.parse_args(argv)
    torchtitans = ([] if args.no_installed else [Torchtitan(INSTALLED, None)]) + args.torchtitan
    rows = matrix(args.workdir.resolve(), torchtitans, args.steps)
    table = markdown(rows, args.steps)
    print(table)
    if args.out:
        args.out.write_text(table)
        args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    # Non-zero when the installed torchtitan cannot run a recipe: the others are what they are.
    installed = [entry for entry in rows if entry["torchtitan"] == INSTALLED]
    return 1 if any(not cell["works"] for entry in installed for cell in entry["recipes"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
