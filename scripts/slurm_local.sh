#!/usr/bin/env bash
# A real single-node SLURM cluster on this machine, for tests and laptops.
#
#   sudo scripts/slurm_local.sh up   [STATE_DIR]   # munged, slurmctld, slurmd; prints the env line
#   eval "$(scripts/slurm_local.sh env [STATE_DIR])" # SLURM_CONF for sbatch, squeue, snakemake
#   sudo scripts/slurm_local.sh down [STATE_DIR]   # stops what `up` started, removes what it left
#
# Needs root and Debian's `slurm-wlm munge` (apt-get install -y slurm-wlm munge). Everything the
# cluster owns lives in STATE_DIR (default $ATLAS_SLURM_DIR, else /tmp/atlas-slurm-<uid>): its own
# munge key and socket, slurm.conf, cgroup.conf, gres.conf, spool, logs and pid files, on ports
# chosen free at start. One thing lives outside it: /etc/slurm/slurm.conf, a symlink to STATE_DIR's
# slurm.conf, because the `srun` that Snakemake's job-step plugin runs inside each job drops
# SLURM_CONF from its environment and reads only the default path. `up` refuses to start when that
# path holds another cluster's config. `up` on a running cluster only prints its env line; `down`
# stops only the daemons whose pids it recorded (checked against their command lines) and removes
# STATE_DIR, the symlink (when it is ours) and the cgroup folders slurmd made for this node.
#
# Cgroups are on (proctrack/cgroup, task/cgroup: a job gets the cores and memory it asked for).
# The machine's NVIDIA GPUs are declared as GRES, so rules with `resources: gpu=N` schedule.
# There is no accounting database: job states come from squeue (MinJobAge=300 keeps finished jobs
# listed for five minutes), which is what profiles/slurm-local tells Snakemake's plugin to use.
set -euo pipefail

cmd=${1:-}
state=${2:-${ATLAS_SLURM_DIR:-/tmp/atlas-slurm-$(id -u)}}
case "$state" in /*) ;; *) state="$PWD/$state" ;; esac
conf="$state/slurm.conf"

die() { echo "slurm_local.sh: $*" >&2; exit 1; }

need_tools() {
    local missing=()
    for t in munged slurmctld slurmd sinfo sbatch squeue scontrol; do
        command -v "$t" >/dev/null || missing+=("$t")
    done
    [ ${#missing[@]} -eq 0 ] || die "missing ${missing[*]}: apt-get install -y slurm-wlm munge"
    [ "$(id -u)" -eq 0 ] || die "slurmd needs root (cgroups, job users): run it with sudo"
}

# A pid recorded in $state/run/<name>.pid that is alive and runs <binary> (guards against reuse).
live_pid() {
    local name=$1 binary=$2 pid
    [ -s "$state/run/$name.pid" ] || return 1
    pid=$(tr -dc '0-9' <"$state/run/$name.pid")
    [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$binary" || return 1
    echo "$pid"
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

node_name() { echo "atlas$(echo -n "$state" | sha256sum | cut -c1-8)"; }

gpu_count() {
    if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
        nvidia-smi -L | grep -c '^GPU '
    else
        echo 0
    fi
}

write_config() {
    local host node ctld_port d_port hw gpus mem
    host=$(hostname -s)
    node=$(node_name)
    ctld_port=$(free_port)
    d_port=$(free_port)
    while [ "$d_port" = "$ctld_port" ]; do d_port=$(free_port); done
    # The hardware line slurmd itself reports, minus its name and a tenth of the memory (the OS).
    hw=$(slurmd -C | head -1 | sed -e 's/^NodeName=[^ ]* //' -e 's/ RealMemory=[0-9]*//')
    mem=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -1)
    mem=$((mem * 9 / 10))
    gpus=$(gpu_count)

    mkdir -p "$state"/{munge,run,log,spool/ctld,spool/d}
    chmod 700 "$state/munge"
    cat >"$conf" <<EOF
# Written by scripts/slurm_local.sh up; removed by down.
ClusterName=atlas
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$state/munge/munge.socket
StateSaveLocation=$state/spool/ctld
SlurmdSpoolDir=$state/spool/d
SlurmctldPidFile=$state/run/slurmctld.pid
SlurmdPidFile=$state/run/slurmd.pid
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd.log
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup,task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Without a default, a job that names no --mem takes the whole node.
DefMemPerCPU=1000
# Finished jobs stay in squeue for 5 min: the status route without accounting.
MinJobAge=300
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
MpiDefault=none
$( [ "$gpus" -gt 0 ] && echo "GresTypes=gpu" )
NodeName=$node NodeHostname=$host NodeAddr=127.0.0.1 $hw RealMemory=$mem$( [ "$gpus" -gt 0 ] && echo " Gres=gpu:$gpus" ) State=UNKNOWN
PartitionName=local Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
    cat >"$state/cgroup.conf" <<EOF
ConstrainCores=yes
ConstrainRAMSpace=yes
ConstrainDevices=$( [ "$gpus" -gt 0 ] && echo yes || echo no )
EOF
    if [ "$gpus" -gt 0 ]; then
        echo "NodeName=$node Name=gpu File=/dev/nvidia[0-$((gpus - 1))]" >"$state/gres.conf"
    fi
}

wait_idle() {
    local node=$1
    for _ in $(seq 1 60); do
        case "$(SLURM_CONF=$conf sinfo -h -n "$node" -o %t 2>/dev/null)" in
            idle*|mix*|alloc*) return 0 ;;
        esac
        sleep 0.5
    done
    echo "--- slurmctld.log" >&2; tail -20 "$state/log/slurmctld.log" >&2 || true
    echo "--- slurmd.log" >&2; tail -20 "$state/log/slurmd.log" >&2 || true
    die "node $node did not come up within 30 s (logs above, in $state/log)"
}

ETC_CONF=/etc/slurm/slurm.conf

# Whether any daemon recorded in a state folder's run/*.pid is still running.
cluster_alive() {
    local pidfile pid
    for pidfile in "$1"/run/*.pid; do
        [ -f "$pidfile" ] || continue
        pid=$(cat "$pidfile" 2>/dev/null) || continue
        [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && return 0
    done
    return 1
}

# /etc/slurm/slurm.conf -> $conf, unless the path holds anything else.
claim_etc_conf() {
    if [ -L "$ETC_CONF" ] && [ "$(readlink "$ETC_CONF")" = "$conf" ]; then
        return 0
    fi
    if [ -L "$ETC_CONF" ] && ! cluster_alive "$(dirname "$(readlink "$ETC_CONF")")"; then
        rm -f "$ETC_CONF"  # a link left by a cluster whose daemons are gone (a killed run)
    fi
    if [ -e "$ETC_CONF" ] || [ -L "$ETC_CONF" ]; then
        die "$ETC_CONF exists ($(readlink "$ETC_CONF" || echo 'a file')): another cluster's config. Jobs' srun reads only that path (Snakemake's job-step plugin drops SLURM_CONF), so this cluster cannot start beside it; bring that one down first"
    fi
    mkdir -p "$(dirname "$ETC_CONF")"
    ln -s "$conf" "$ETC_CONF"
}

up() {
    need_tools
    if live_pid slurmctld slurmctld >/dev/null && live_pid slurmd slurmd >/dev/null \
        && live_pid munged munged >/dev/null; then
        echo "export SLURM_CONF=$conf"
        return 0
    fi
    # A half-started cluster (a daemon died): stop what is left and start clean.
    [ -d "$state" ] && down >/dev/null
    write_config
    claim_etc_conf
    local node
    node=$(node_name)
    mungekey --create --keyfile="$state/munge/munge.key" --bits=1024 2>/dev/null \
        || dd if=/dev/urandom of="$state/munge/munge.key" bs=1024 count=1 status=none
    chmod 400 "$state/munge/munge.key"
    munged --force --socket="$state/munge/munge.socket" --key-file="$state/munge/munge.key" \
        --pid-file="$state/run/munged.pid" --log-file="$state/log/munged.log" \
        --seed-file="$state/munge/munged.seed"
    SLURM_CONF=$conf slurmctld -f "$conf"
    SLURM_CONF=$conf slurmd -f "$conf" -N "$node"
    wait_idle "$node"
    echo "export SLURM_CONF=$conf"
}

stop_pid() {
    local name=$1 binary=$2 pid
    pid=$(live_pid "$name" "$binary") || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    for _ in $(seq 1 40); do
        [ -d "/proc/$pid" ] || return 0
        sleep 0.25
    done
    kill -KILL "$pid" 2>/dev/null || true
}

down() {
    [ -d "$state" ] || return 0
    local node
    node=$(node_name)
    if live_pid slurmctld slurmctld >/dev/null; then
        # Jobs first, so no job step outlives its daemon.
        SLURM_CONF=$conf scancel --full --quiet -w "$node" 2>/dev/null || true
        for _ in $(seq 1 40); do
            [ -z "$(SLURM_CONF=$conf squeue -h -w "$node" -t R,CG 2>/dev/null)" ] && break
            sleep 0.25
        done
    fi
    stop_pid slurmd slurmd
    stop_pid slurmctld slurmctld
    stop_pid munged munged
    # The cgroup folders slurmd made for this node (deepest first; only empty ones go).
    for root in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
        for dir in "$root"slurm_"$node" "$root"system.slice/slurmstepd_"$node".scope; do
            [ -d "$dir" ] && find "$dir" -depth -type d -exec rmdir {} + 2>/dev/null || true
        done
    done
    if [ -L "$ETC_CONF" ] && [ "$(readlink "$ETC_CONF")" = "$conf" ]; then
        rm -f "$ETC_CONF"
    fi
    rm -rf "$state"
}

case "$cmd" in
    up) up ;;
    down) down ;;
    env) [ -f "$conf" ] || die "no cluster in $state: run \`$0 up\` first"; echo "export SLURM_CONF=$conf" ;;
    *) die "usage: $0 up|down|env [STATE_DIR]" ;;
esac
