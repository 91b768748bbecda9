#!/usr/bin/env bash
# Start a one-node SLURM cluster on this (Debian) machine, as root, for the tests marked `slurm`:
# munged (as user munge), slurmctld and slurmd with /etc/slurm/slurm.conf written for this host
# (its short hostname, CPU count and memory), one partition `debug`. Idempotent: daemons already
# running with the same configuration are left alone. Returns when `sinfo` shows the node idle.
#
#   apt-get install -y --no-install-recommends slurm-wlm munge   # once (9 packages)
#   tests/slurm/start_cluster.sh && pytest -m slurm               # tests/slurm/stop_cluster.sh ends it
#
# No accounting (sacct fails; squeue lists queued and running jobs), proctrack/linuxproc and
# task/none (no cgroups, as in containers); a 10 s credential lifetime, which is also how long a
# requeued job waits before it can start again (SLURM's default: 120 s), and scheduling every 2 s,
# so that a requeued job restarts ~11 s after `scontrol requeue`.
set -euo pipefail

if [[ $EUID -ne 0 ]]; then
  echo "error: $0 must run as root (it starts munged, slurmctld and slurmd)" >&2; exit 2
fi
for tool in munged slurmctld slurmd sinfo scontrol; do
  if ! command -v "$tool" >/dev/null; then
    echo "error: $tool is not installed: apt-get install -y --no-install-recommends slurm-wlm munge" >&2
    exit 2
  fi
done

HOST="$(hostname -s)"
CPUS="$(nproc)"
MEMORY_MB="$(awk '/^MemTotal:/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)"  # 10 % for the OS
CONF=/etc/slurm/slurm.conf
STATE=/var/lib/slurm/slurmctld
SPOOL=/var/lib/slurm/slurmd
LOGS=/var/log/slurm

# -- munge --------------------------------------------------------------------------------------
install -d -o munge -g munge -m 0755 /run/munge
install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge /etc/munge
if [[ ! -s /etc/munge/munge.key ]]; then
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
fi
chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  runuser -u munge -- munged
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n | unmunge >/dev/null || { echo "error: munged did not start" >&2; exit 1; }
fi

# -- slurm.conf ---------------------------------------------------------------------------------
install -d -m 0755 /etc/slurm "$STATE" "$SPOOL" "$LOGS"
WANTED="$(cat <<CONFIG
# Written by tests/slurm/start_cluster.sh: a one-node cluster for tests.
ClusterName=cfsl
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=10
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=2,sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
StateSaveLocation=$STATE
SlurmdSpoolDir=$SPOOL
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
KillWait=30
NodeName=$HOST CPUs=$CPUS RealMemory=$MEMORY_MB State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
CONFIG
)"
changed=0
if [[ ! -f $CONF ]] || [[ "$(cat "$CONF")" != "$WANTED" ]]; then
  printf '%s\n' "$WANTED" > "$CONF"
  changed=1
fi

# -- daemons ------------------------------------------------------------------------------------
running() {  # running PIDFILE: the daemon of that pid file is alive
  [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null
}
if [[ $changed == 1 ]] && running /run/slurmctld.pid; then
  scontrol shutdown >/dev/null 2>&1 || true
  for _ in $(seq 100); do running /run/slurmctld.pid || running /run/slurmd.pid || break; sleep 0.1; done
fi
running /run/slurmctld.pid || slurmctld
running /run/slurmd.pid || slurmd

for _ in $(seq 300); do
  state="$(sinfo -h -n "$HOST" -o %T 2>/dev/null || true)"
  case "$state" in
    idle|mixed|allocated) echo "slurm: node $HOST $state (partition debug, $CPUS CPUs, ${MEMORY_MB} MB)"; exit 0;;
    down*|drain*) scontrol update NodeName="$HOST" State=RESUME >/dev/null 2>&1 || true;;
  esac
  sleep 0.2
done
echo "error: the node $HOST did not become idle within 60 s (sinfo: ${state:-no answer});" \
     "see $LOGS/slurmctld.log and $LOGS/slurmd.log" >&2
exit 1
