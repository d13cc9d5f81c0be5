"""`python -m snakemake` for the test cluster, with the SLURM executor plugin's job-status query every
POLL_SECONDS (tests/conftest.py runs the shared pipeline through it).

The plugin waits 10 s longer after each query that finds no job finished, up to 3 min: kind to a production
slurmctld, whose jobs take hours. On this one-node cluster, whose jobs take seconds and run one after another, a
job that ended is seen up to half a minute late, and the node waits with it. Only how often Snakemake asks
changes: each job, its submission and its accounting are the plugin's own.
"""

import snakemake_executor_plugin_slurm as slurm
from snakemake.cli import main

POLL_SECONDS = 1


def _poll_interval(executor) -> int:
    return POLL_SECONDS


def _ignore_backoff(executor, seconds) -> None:
    """The plugin's own interval (its back-off) is set and not used."""


slurm.Executor.next_seconds_between_status_checks = property(_poll_interval, _ignore_backoff)

if __name__ == "__main__":
    main()
