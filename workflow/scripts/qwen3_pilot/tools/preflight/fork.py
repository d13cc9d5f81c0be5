"""The TorchTitan Neuron fork checked before a trn2 is rented (the preflight's `--fork`): a clone at the release's ref,
its base on upstream torchtitan and that commit's date where the histories allow, the API every recipe needs in the
fork's own torchtitan, and each recipe launched for a few steps on that torchtitan (tiny widths, gloo ranks here).
Stage-free: it runs in the preflight's process and the subprocesses it starts.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from ..titan_compat import Torchtitan, api_probe, missing_launches, row

# Where the fork's base is looked for: upstream torchtitan's main branch.
UPSTREAM_TORCHTITAN = "https://github.com/pytorch/torchtitan.git"
# The steps of each recipe's launch on the fork's torchtitan: as fail_fast's, enough for an optimizer step and a
# second forward on the updated weights.
FORK_LAUNCH_STEPS = 2


class ForkError(RuntimeError):
    pass


def git(*args: str, cwd: Path | None = None) -> str:
    """A git command's output; a failure raises ForkError with git's own message."""
    result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise ForkError(f"git {' '.join(args)}: {result.stderr.strip() or f'exit {result.returncode}'}")
    return result.stdout.strip()


def fork_base(clone: Path, upstream: str, branch: str = "main") -> dict[str, Any]:
    """The clone's merge-base with upstream's `branch`, fetched into the clone, and that commit's date; where the
    histories cannot tell (a shallow clone, no upstream reachable, no common commit), why instead."""
    try:
        git("fetch", "--quiet", "--no-tags", upstream, f"+{branch}:refs/preflight/upstream", cwd=clone)
    except ForkError as error:
        return {"merge_base": None, "why": f"upstream {upstream} not fetched: {error}"}
    if git("rev-parse", "--is-shallow-repository", cwd=clone) == "true":
        return {"merge_base": None, "why": "the fork's clone is shallow: its history cannot show where it branched"}
    try:
        base = git("merge-base", "HEAD", "refs/preflight/upstream", cwd=clone)
    except ForkError:
        return {"merge_base": None, "why": f"no commit in common with {upstream} {branch}"}
    return {"merge_base": base, "merge_base_date": git("show", "-s", "--format=%cs", base, cwd=clone),
            "fork_commits_since": int(git("rev-list", "--count", f"{base}..HEAD", cwd=clone)),
            "upstream_commits_since": int(git("rev-list", "--count", f"{base}..refs/preflight/upstream", cwd=clone))}


def fork_check(fork: str, ref: str, upstream: str, work: Path) -> dict[str, Any]:
    """The fork at `ref`, cloned into `work` (a path or URL; the given clone is never changed): its commit, its
    base on upstream and the API every recipe needs, checked against the fork's own torchtitan."""
    clone = work / "fork"
    shutil.rmtree(clone, ignore_errors=True)  # an earlier preflight's clone
    git("clone", "--quiet", "--no-checkout", fork, str(clone))
    # A branch of the fork is the clone's origin/<ref>; a tag or a commit is itself.
    branch = git("branch", "--list", "--remotes", f"origin/{ref}", cwd=clone)
    git("checkout", "--quiet", "--detach", f"origin/{ref}" if branch else ref, cwd=clone)
    figures = {"fork": fork, "ref": ref, "commit": git("rev-parse", "HEAD", cwd=clone), "upstream": upstream,
               **fork_base(clone, upstream)}
    # The same probe as the fork's launches read (fork_launches: titan_compat.row), asked once.
    api = api_probe(Torchtitan("fork", clone))
    figures["torchtitan"] = api["version"]
    if api["refused"]:
        raise ForkError(f"the fork at {ref} ({figures['commit'][:12]}): {api['refused']}")
    missing = {user: names for user, names in api["missing_on_neuron"].items() if names}
    if missing:
        raise ForkError(f"the fork at {ref} ({figures['commit'][:12]}, base {figures.get('merge_base_date', '?')})"
                        " lacks names these use:\n" + "\n".join(
                            f"  {user}:\n" + "\n".join(f"    - {name}" for name in names)
                            for user, names in missing.items()))
    figures["api"] = {user: "every name present" for user in api["missing_on_neuron"]}
    return figures


def fork_launches(clone: Path, cpu_run: Path, scratch: Path, steps: int = FORK_LAUNCH_STEPS, **row_options
                  ) -> dict[str, Any]:
    """Each recipe's recorded trainer launch of the finished cpu run in `cpu_run` again, for `steps` steps, with the
    fork's clone first on the ranks' import path (titan_compat.row: its API probe, then the relaunch): whether the
    fork's own torchtitan trains every recipe, here, on gloo ranks at the run's tiny widths. It proves the fork's
    torchtitan API and trainer, not its neuron recipes, kernels or compiler (those need a trn2: fail_fast there).
    `row_options`: titan_compat.row's."""
    if missing := missing_launches(cpu_run):
        raise ForkError(f"{missing}, then the preflight again")
    result = row(cpu_run, Torchtitan("fork", clone), steps, scratch, **row_options)
    failed = {name: cell["why"] for name, cell in result["recipes"].items() if not cell["works"]}
    if failed:
        raise ForkError(f"the fork's torchtitan ({result['version']}) does not train " + "; ".join(
            f"{name}: {why}" for name, why in failed.items()))
    return {"torchtitan": result["version"], "level": result["level"], "steps": steps,
            "recipes": {name: cell["why"] for name, cell in result["recipes"].items()}}
