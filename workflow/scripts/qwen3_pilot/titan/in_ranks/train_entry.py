"""Trainer entry point for torchrun: the backend's preparation and kernels, then torchtitan's own main().

    python -m torch.distributed.run ... -m qwen3_pilot.titan.in_ranks.train_entry
        --module qwen3_pilot.titan.in_ranks.recipes --config F ...
"""

from __future__ import annotations

import gc

# A rank (torchrun's `-m`, not an import of this module): the cyclic collector off while it imports torch and
# torchtitan, until main turns it back on. The imports make some hundred thousand objects, and the collector walked
# them again and again as they came: a 2-rank, 2-step launch took 11.2 CPU-seconds instead of 13.9 here.
if __name__ == "__main__":
    gc.disable()

import logging
import os
import sys

from torch.distributed.elastic.multiprocessing.errors import record

from ...backends import backend_module
from ...lifetime import die_with_parent, end_import_pause, exit_once_recorded
from ..titan_api import check_torchtitan_api
from .recipes import load_recipe


def config_function(argv: list[str]) -> str | None:
    """The recipe this trainer was started with (torchtitan's --config F, or --config=F)."""
    for index, arg in enumerate(argv):
        if arg == "--config" and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


@record  # a failing rank writes its exception to torchrun's error file; launch.py reads it
def main() -> None:
    die_with_parent()
    recipe = load_recipe()
    backend = backend_module(recipe.backend)
    applied = backend.prepare_torchtitan()
    # The fork's version string says nothing about its API: name anything this recipe uses that this
    # torchtitan lacks before its config function fails on it. One rank suffices; torchrun stops the rest.
    if os.environ.get("RANK", "0") == "0":
        check_torchtitan_api(backend=recipe.backend, user=config_function(sys.argv))
    # Before the recipe builds the model: the replaced modules log the implementation that runs.
    kernels = backend.install_kernels() if recipe.replacements else {}
    from torchtitan.train import main as torchtitan_main

    end_import_pause()
    log = logging.getLogger(__name__)
    log.warning("backend workarounds applied: %s", applied or "none")
    log.warning("kernel implementations: %s", kernels or "no kernel replacements in this recipe")
    torchtitan_main()
    # The run is recorded and the process group destroyed. A rank's interpreter teardown after that aborted
    # once ("terminate called without an active exception", exit -6, after moe_reduced's last step in a fresh
    # clone's make report) and failed a finished run; nothing in it is the run's.
    exit_once_recorded()


if __name__ == "__main__":
    main()
