"""The cpu backend: any Linux box, gloo process group, one OS process per rank.

Every CPU workaround for torchtitan lives here, each with the failure it avoids.
"""

from __future__ import annotations

import os
from typing import Any

from . import Backend, cache_env


def make_backend(config: dict[str, Any], cache_root: str) -> Backend:
    ranks = config["ranks"]
    # Ranks share the machine's cores; without a cap each rank starts one thread per core and
    # the ranks oversubscribe the CPU.
    threads = max(1, (os.cpu_count() or 1) // ranks)
    env = {**cache_env(cache_root), "OMP_NUM_THREADS": str(threads)}
    return Backend(
        name="cpu",
        device_type="cpu",
        dist_backend="gloo",
        expected_ranks=ranks,
        launcher_env=env,
        unavailable_reason=None,
    )
