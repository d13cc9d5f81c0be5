"""tests/slurm/cluster.sh cleans up after a test run that was killed: its client config (which names the cluster's
folder and the process that started it) is removed, with the cluster, once that process is gone; a cluster in use
and a configuration that is not the script's are left alone. Run against a client config in a temp folder."""

from __future__ import annotations

import os
import subprocess

import pytest
from conftest import SLURM_CLUSTER, slurm_unavailable

pytestmark = [pytest.mark.slurm, pytest.mark.skipif(slurm_unavailable() is not None,
                                                    reason=slurm_unavailable() or "")]


def clean_stale(conf):
    env = {**os.environ, "QWEN3_PILOT_SLURM_CLIENT_CONF": str(conf)}
    return subprocess.run([str(SLURM_CLUSTER), "clean-stale"], capture_output=True, text=True, env=env, timeout=60)


def client_conf(tmp_path, owner: int):
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"# tests/slurm/cluster.sh: a one-node test cluster on loopback\n# state: {tmp_path / 'state'}\n"
                    f"# owner: {owner}\nClusterName=pilot\n")
    return conf


def test_a_cluster_whose_test_run_is_gone_is_removed(tmp_path):
    finished = subprocess.Popen(["true"])
    finished.wait()
    conf = client_conf(tmp_path, finished.pid)
    result = clean_stale(conf)
    assert result.returncode == 0, result.stderr
    assert f"removing a test cluster left behind from {tmp_path / 'state'}" in result.stderr
    assert not conf.exists()


def test_a_cluster_in_use_and_a_foreign_config_are_left_alone(tmp_path):
    conf = client_conf(tmp_path, os.getpid())
    result = clean_stale(conf)
    assert result.returncode == 3 and f"is in use by process {os.getpid()}" in result.stderr
    assert conf.exists()
    conf.write_text("ClusterName=somebody-elses\n")
    assert clean_stale(conf).returncode == 0 and conf.read_text() == "ClusterName=somebody-elses\n"
