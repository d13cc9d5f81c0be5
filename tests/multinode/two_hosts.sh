#!/usr/bin/env bash
# Stands in for `srun --ntasks-per-node=1` on hosts made as network namespaces (tests/e2e/test_multinode.py):
# runs the same command once in each namespace named in QWEN3_PILOT_TEST_HOSTS, with that name as its
# hostname and QWEN3_PILOT_TEST_HOSTS_FILE as its /etc/hosts (torchrun resolves its own hostname, and the
# rendezvous hands every node the hostname of global rank 0's), and exits non-zero when any of them fails,
# as srun --kill-on-bad-exit would.
set -u
pids=()
for host in ${QWEN3_PILOT_TEST_HOSTS:?space-separated network namespace names}; do
    nsenter --net="/run/netns/$host" unshare --uts --mount \
        sh -c 'mount --bind "$QWEN3_PILOT_TEST_HOSTS_FILE" /etc/hosts && hostname "$0" && exec "$@"' "$host" "$@" &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
    wait "$pid" || status=$?
done
exit "$status"
