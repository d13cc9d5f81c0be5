#!/usr/bin/env bash
# A one-node SLURM cluster on loopback for tests/e2e/test_slurm.py: Debian's slurm-wlm (22.05) with munge, and
# slurmdbd on MariaDB, because snakemake-executor-plugin-slurm reads job states from sacct (accounting).
#   tests/slurm/cluster.sh start DIR   installs the Debian packages when missing, writes every config file
#                                      under DIR, starts munged, mariadbd, slurmdbd, slurmctld and slurmd,
#                                      and prints SLURM_CONF=DIR/slurm.conf and NETNS=<namespace>
#   tests/slurm/cluster.sh stop DIR    stops the daemons started from DIR and removes the namespace
#   tests/slurm/cluster.sh clean-stale    stops a cluster this script left behind (a test run that was killed:
#                                      its client config in /etc/slurm stalls every SLURM query) and removes it
# The SLURM daemons run in a network namespace of their own with only a loopback interface (slurmctld
# binds to every address), so nothing listens beyond loopback;
# SLURM's clients, and the snakemake that submits through them, run in it too
# (nsenter --net=/run/netns/NETNS ...).
# MariaDB listens on a socket only. Needs root (or sudo): slurmd must be root to start jobs.
set -euo pipefail

action=${1:?usage: cluster.sh start|stop DIR, or cluster.sh clean-stale}
SUDO=$([ "$(id -u)" -eq 0 ] || echo sudo)
PACKAGES=(slurm-wlm slurmdbd munge mariadb-server iproute2)
# The client config SLURM's tools read by default (a job's srun among them); a test may point elsewhere.
CLIENT_CONF=${QWEN3_PILOT_SLURM_CLIENT_CONF:-/etc/slurm/slurm.conf}
MARKER="# tests/slurm/cluster.sh"

# A cluster this script started and nothing stopped: its client config names its folder ("# state: DIR") and
# the process that started it ("# owner: PID"); while that process lives, the cluster is in use (exit 3).
if [ "$action" = clean-stale ]; then
    grep -qs "^$MARKER" "$CLIENT_CONF" || exit 0
    stale=$(sed -n 's/^# state: //p' "$CLIENT_CONF" | head -n 1)
    owner=$(sed -n 's/^# owner: //p' "$CLIENT_CONF" | head -n 1)
    if [ -n "$owner" ] && kill -0 "$owner" 2>/dev/null; then
        echo "cluster.sh: the test cluster in $stale is in use by process $owner ($CLIENT_CONF)" >&2
        exit 3
    fi
    echo "cluster.sh: removing a test cluster left behind${stale:+ from $stale} ($CLIENT_CONF)" >&2
    [ -n "$stale" ] && "$0" stop "$stale"
    grep -qs "^$MARKER" "$CLIENT_CONF" && $SUDO rm -f "$CLIENT_CONF"
    exit 0
fi
dir=$(realpath -m "${2:?usage: cluster.sh start|stop DIR}")
# One namespace per state folder: stopping one cluster never touches another's.
NETNS=qwen3-pilot-slurm-$(printf %s "$dir" | md5sum | cut -c1-8)
# nsenter switches the network namespace only: `ip netns exec` also remounts /sys, hiding the cgroup
# file system that slurmd needs.
in_netns() { $SUDO nsenter --net="/run/netns/$NETNS" "$@"; }

stop() {
    for pidfile in slurmd slurmctld slurmdbd mariadbd munged; do
        if [ -f "$dir/run/$pidfile.pid" ]; then
            $SUDO kill "$(cat "$dir/run/$pidfile.pid")" 2>/dev/null || true
        fi
    done
    # Give each daemon a moment to write its state and exit.
    for _ in $(seq 20); do
        alive=0
        for pidfile in "$dir"/run/*.pid; do
            [ -f "$pidfile" ] && $SUDO kill -0 "$(cat "$pidfile")" 2>/dev/null && alive=1
        done
        [ $alive -eq 0 ] && break
        sleep 0.5
    done
    $SUDO ip netns delete "$NETNS" 2>/dev/null || true
    # Without its controller, a client configuration stalls every SLURM query, and with it every Snakemake
    # start (the SLURM plugin asks `scontrol show config` when it loads).
    if grep -qs "^# state: $dir\$" "$CLIENT_CONF"; then
        $SUDO rm -f "$CLIENT_CONF"
    fi
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
    local deadline=$((SECONDS + $1)) what=$2
    shift 2
    while [ $SECONDS -lt $deadline ]; do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.25
    done
    echo "cluster.sh: $what did not come up in time; logs in $dir/log" >&2
    return 1
}

if [ "$action" = stop ]; then
    stop
    exit 0
fi
[ "$action" = start ] || { echo "cluster.sh: unknown action $action (start or stop)" >&2; exit 2; }

missing=()
for package in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
    $SUDO apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

"$0" clean-stale
stop
rm -rf "$dir"
mkdir -p "$dir"/{run,log,state,spool,mysql}
host=$(hostname -s)
cpus=$(nproc)
# What slurmd reports, less a margin, so that a job may ask for most of the machine's memory.
memory_mb=$(( $(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo) * 9 / 10 ))

$SUDO ip netns add "$NETNS"
in_netns ip link set lo up
# The daemons resolve their listening address with AI_ADDRCONFIG, which ignores loopback: a veth pair with
# both ends inside the namespace gives it a non-loopback address that no other namespace can reach.
in_netns ip link add slurm0 type veth peer name slurm1
in_netns ip addr add 10.233.0.1/30 dev slurm0
in_netns ip link set slurm0 up
in_netns ip link set slurm1 up

# munge: the packaged key, on the default socket (SLURM's clients look there); as root it needs --force.
$SUDO mkdir -p /run/munge
$SUDO munged --force --pid-file="$dir/run/munged.pid" \
    --log-file="$dir/log/munged.log" --seed-file="$dir/state/munge.seed"

# MariaDB on a socket only (no TCP port), its data under DIR.
$SUDO mariadb-install-db --no-defaults --datadir="$dir/mysql" --user=root --auth-root-authentication-method=normal \
    >"$dir/log/mariadb-install.log" 2>&1
$SUDO mariadbd --no-defaults --datadir="$dir/mysql" --socket="$dir/run/mysql.sock" --skip-networking \
    --user=root --pid-file="$dir/run/mariadbd.pid" --log-error="$dir/log/mariadbd.log" &
wait_for 30 MariaDB mariadb --no-defaults --socket="$dir/run/mysql.sock" -u root -e "select 1"
mariadb --no-defaults --socket="$dir/run/mysql.sock" -u root <<SQL
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'pilot-test-only';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
SQL

cat >"$dir/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=pilot-test-only
StorageLoc=slurm_acct_db
PidFile=$dir/run/slurmdbd.pid
LogFile=$dir/log/slurmdbd.log
EOF
chmod 600 "$dir/slurmdbd.conf"

cat >"$dir/slurm.conf" <<EOF
# tests/slurm/cluster.sh: a one-node test cluster on loopback
# state: $dir
# owner: $PPID
ClusterName=pilot
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStorageTRES=cpu,mem,node
JobAcctGatherType=jobacct_gather/linux
# The executor plugin names each job by its run and writes the rule into the comment: keep the comment.
AccountingStoreFlags=job_comment
# Jobs stay visible to squeue for 5 minutes; sacct keeps them for good.
MinJobAge=300
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
# A job submitted is started at the scheduler's next pass: at most 1 s here (measured), 2 s with the defaults,
# which a pipeline of short jobs run one after another pays once per job.
SchedulerParameters=sched_min_interval=0,batch_sched_delay=0
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory_mb State=UNKNOWN
PartitionName=pilot Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF

export SLURM_CONF="$dir/slurm.conf"
# SLURM's clients inside a job (the srun that the executor's job step runs) read the default path: the plugin
# drops the job's inherited SLURM_* variables, SLURM_CONF among them. A real cluster's file is never replaced.
if [ -e "$CLIENT_CONF" ] && ! grep -q "^$MARKER" "$CLIENT_CONF"; then
    echo "cluster.sh: $CLIENT_CONF exists and is not this script's; not replacing it" >&2
    exit 1
fi
$SUDO mkdir -p "$(dirname "$CLIENT_CONF")"
$SUDO cp "$SLURM_CONF" "$CLIENT_CONF"
# slurmdbd finds the database socket through the client library's environment variable.
# slurmdbd reads slurmdbd.conf from the folder of SLURM_CONF.
in_netns env MYSQL_UNIX_PORT="$dir/run/mysql.sock" SLURM_CONF="$SLURM_CONF" slurmdbd
wait_for 30 slurmdbd in_netns timeout 5 sacctmgr -i list cluster
for entity in "cluster pilot" "account pilot Description=tests Organization=tests" \
        "user $(id -un) Account=pilot DefaultAccount=pilot"; do
    # shellcheck disable=SC2086 # one sacctmgr argument per word
    in_netns timeout 10 sacctmgr -i add $entity >/dev/null 2>&1 || true
done
in_netns env SLURM_CONF="$SLURM_CONF" slurmctld
in_netns env SLURM_CONF="$SLURM_CONF" slurmd
wait_for 60 "the node" in_netns sh -c "sinfo -h -N -o '%t' | grep -qx idle"
echo "SLURM_CONF=$SLURM_CONF"
echo "NETNS=$NETNS"
