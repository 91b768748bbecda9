#!/usr/bin/env bash
# Stop what tests/slurm/start_cluster.sh started: every job, slurmctld, slurmd, then munged.
set -uo pipefail

running() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

if running /run/slurmctld.pid; then
  scancel --user="$(id -un)" >/dev/null 2>&1 || true
  scontrol shutdown >/dev/null 2>&1 || true
fi
for pidfile in /run/slurmd.pid /run/slurmctld.pid; do
  for _ in $(seq 100); do running "$pidfile" || break; sleep 0.1; done
  if running "$pidfile"; then kill "$(cat "$pidfile")" 2>/dev/null || true; fi
done
for pidfile in /run/munge/munged.pid /var/run/munge/munged.pid; do
  if running "$pidfile"; then kill "$(cat "$pidfile")" && break; fi
done
echo "slurm: stopped"
