"""The trn2 preflight: everything about a trn2 configuration that can be checked without a trn2, on any
machine, before anyone rents one.

    python -m qwen3_pilot.tools.preflight --configfile config/trn2.yaml [--model-configs DIR] [--out DIR]
    (make preflight)

1. the config: config/config.yaml with the given files laid over it, validated against the schema and the
   cross-key rules, exactly as the Snakefile does;
2. torchtitan's API: every class, field and function the recipes use exists (titan_api);
3. every recipe's full torchtitan config, built by the recipes' own config functions from the published
   models' config.json values (`--model-configs`: <repo name>.config.json for weights.repo_id, and
   Qwen3-30B-A3B.config.json for the reduced MoE's widths): config parity, the kernel converters and their
   replacement counts (rope_hf on the native 4B model as well, configured or not), parameter counts on
   the meta device;
4. the 64-rank FSDP plan of the 4B model (memory per rank, torchtitan's fake process group);
5. the exact launch command and environment of every neuron stage that uses the device;
6. with `--fork PATH_OR_URL`: the TorchTitan Neuron clone at the release's ref (or `--fork-ref`), its merge-base
   with upstream torchtitan (`--upstream`, fetched into a scratch clone) and that commit's date where the
   histories allow, the API check of step 2 against the fork's own torchtitan, in a fresh interpreter, and each
   recipe's launch of the finished cpu run in `--cpu-run` (default: here, after `make report`) again for 2 steps
   with the fork's torchtitan (fork.py).

It writes preflight.json and preflight.html into `--out` and exits non-zero when a check failed. Nothing
here runs on Trainium, and the report says so.
"""

from __future__ import annotations

from ...paths import WORKFLOW

RESOURCES = WORKFLOW / "resources"
# The published models' config.json values, and AWS's component list per SDK release
# (sdk-<release>-components.md): each folder's README says where they come from.
DEFAULT_MODEL_CONFIGS = RESOURCES / "qwen3-configs"
PUBLISHED_COMPONENTS = RESOURCES / "neuron"


class PreflightError(RuntimeError):
    """A check's finding, said in the check's own words (every check's failure is recorded, then the preflight
    exits non-zero)."""
