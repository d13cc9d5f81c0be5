"""`python -m snakemake` with the SLURM executor plugin's status polls capped at POLL_CAP_S seconds, for the test
cluster only. The plugin backs its sacct polls off by 10 s each round that sees no job finish (1, 11, 21, ...
s after a submission), which on a real cluster spares slurmctld and costs nothing next to hours-long jobs; the
test run's jobs last seconds, so each would wait up to a poll interval longer than its work. Usage is that of
`python -m snakemake`."""

import sys

from snakemake.cli import main
from snakemake_executor_plugin_slurm import Executor
from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor

POLL_CAP_S = 2

_interval = RemoteExecutor.next_seconds_between_status_checks
Executor.next_seconds_between_status_checks = property(
    _interval.fget, lambda self, seconds: _interval.fset(self, min(seconds, POLL_CAP_S))
)

if __name__ == "__main__":
    sys.exit(main())
