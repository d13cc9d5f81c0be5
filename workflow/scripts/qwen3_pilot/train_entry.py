"""Trainer entry point for torchrun: the backend's preparation, then torchtitan's own main().

    python -m torch.distributed.run ... -m qwen3_pilot.train_entry --module qwen3_pilot.recipes --config F ...
"""

from __future__ import annotations

import logging

from .backends import backend_module
from .recipes import load_recipe

if __name__ == "__main__":
    applied = backend_module(load_recipe()["backend"]).prepare_torchtitan()
    from torchtitan.train import main

    logging.getLogger(__name__).warning("backend workarounds applied: %s", applied or "none")
    main()
