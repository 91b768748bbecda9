#!/usr/bin/env bash
# The CPU reference grid (issue 29), in the order its rows are wanted: one
# `launch.sweep` invocation per group, all into one sweep folder. A sweep skips
# finished runs and resumes interrupted ones exactly, so re-running this script
# (after a stop, in a later session) continues where it stopped. On a new machine (an
# empty SWEEP_DIR) it continues from the repository's rows: a learner whose rows of a
# cell are all complete in docs/reference/results.csv (or $REFERENCE_CSV) is skipped.
#
#   nice -n 19 benchmarks/reference/run_cpu.sh SWEEP_DIR MANUAL_DIR [DATA_DIR] >> LOG 2>&1 &
#
# SWEEP_DIR: the sweep folder (keep it outside the repository); MANUAL_DIR: the
# folder with images_background.zip and images_evaluation.zip (full Omniglot);
# DATA_DIR: where the prepared TFDS dataset lives (default: the sweep's own).
# Runs the cfsl_jax of the active Python environment (python -m cfsl_jax.launch.sweep).
# Budgets: cpu_3200.flags (ProtoNets, MAML++ L,
# the fine-tuners) and cpu_800.flags (SCA, MAML++ H); then, with the CPU time left,
# cpu_1600.flags (SCA, MAML++ H on B3), then cpu_3200.flags for them on B3 (all eight learners
# at one budget); README.md beside this file.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
if [[ $# -lt 2 ]]; then
  echo "usage: $0 SWEEP_DIR MANUAL_DIR [DATA_DIR]" >&2
  exit 2
fi
sweep_dir=$(realpath -m "$1")
manual_dir=$(realpath -m "$2")
data_dir=$(realpath -m "${3:-$sweep_dir/tensorflow_datasets}")
mkdir -p "$sweep_dir"
# Huge pages for XLA:CPU's per-call buffers (README, "Huge pages on CPU"): same numbers, less
# time zeroing pages; glibc < 2.35 ignores the tunable.
export GLIBC_TUNABLES=${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}glibc.malloc.hugetlb=1
cd "$sweep_dir"  # no cfsl_jax folder in the working directory to shadow the installed package
# The code's commit, from git or (a `git archive` copy) the file COMMIT in the root;
# "+dirty" when the checkout has uncommitted changes.
commit=$(git -C "$root" rev-parse HEAD 2>/dev/null || cat "$root/COMMIT")
if git -C "$root" rev-parse 2>/dev/null && [[ -n $(git -C "$root" status --porcelain) ]]; then
  commit="$commit+dirty"
fi
reference_csv=$(realpath -m "${REFERENCE_CSV:-$root/docs/reference/results.csv}")
# the learners that train nothing (minutes each) first, the longest last
cheap=init_tune,ewc_init,protonets,maml_low,ewc_pretrain,pretrain_tune
costly=maml_high,sca
declare -A budget=([cpu_3200.flags]=8x50x8 [cpu_800.flags]=4x25x8 [cpu_1600.flags]=8x25x8)  # CSV names

sweep() {  # sweep FLAGFILE LEARNERS CELL SEEDS [FOLDER under SWEEP_DIR]
  local learners workdir="$sweep_dir${5:+/$5}"
  learners=$(python -c 'import sys; from cfsl_jax.experiments import reference as r
print(",".join(r.remaining(r.read_rows(sys.argv[1]), *sys.argv[2:])))' \
    "$reference_csv" "${budget[$1]}" "$2" "$3" "$4")
  if [[ -z $learners ]]; then
    echo "=== $(date -u +%FT%TZ) $2 on $3, seeds $4 ($1): complete in $reference_csv"
    return
  fi
  set -- "$1" "$learners" "$3" "$4" "${5:-}"
  echo "=== $(date -u +%FT%TZ) $2 on $3, seeds $4 ($1), commit $commit"
  # provenance.jsonl: which commit ran which runs, from when (the export reads it)
  printf '{"start": "%s", "commit": "%s", "flagfile": "%s", "learners": "%s", "cell": "%s", "seeds": "%s"}\n' \
    "$(date -u +%FT%TZ)" "$commit" "$1" "$2" "$3" "$4" >> "$sweep_dir/provenance.jsonl"
  python -m cfsl_jax.launch.sweep --flagfile="$here/common.flags" --flagfile="$here/$1" --workdir="$workdir" --learners="$2" \
    --cells="$3" --seeds="$4" --workers=1 --manual_dir="$manual_dir" --data_dir="$data_dir" \
    || status=$?
  if [[ ${status:-0} -ge 128 ]]; then  # stopped by a signal: every run checkpointed; stop here
    echo "=== $(date -u +%FT%TZ) stopped (exit ${status}); run this script again to continue"
    exit "$status"
  elif [[ ${status:-0} -ne 0 ]]; then  # a run failed: its error is above; go on with the rest
    echo "=== $(date -u +%FT%TZ) the sweep exited ${status}; going on"
  fi
  status=0
}

for cell in B3 A3 C3 D4; do
  sweep cpu_3200.flags "$cheap" "$cell" 0
  sweep cpu_800.flags "$costly" "$cell" 0
done
# unpacked: on 2 CPU cores a pack saves nothing (docs/results.md: 0.95-1.01 of the unpacked
# sweep's wall time) and a lone run's numbers are the bit-exact ones
sweep cpu_3200.flags protonets,maml_low B3 1,2
# seeds 1 and 2 of the fine-tuners on B3: the pretraining and EWC differences paired over 3 seeds
sweep cpu_3200.flags init_tune,ewc_init,pretrain_tune,ewc_pretrain B3 1,2
# the costly learners further along, CPU time allowing; in a folder of its own, as a run's folder
# names no budget (sweep_plan.run_dir) and the 800-task runs of the same cell and seed hold theirs
sweep cpu_1600.flags maml_high,sca B3 0 cpu_1600
# and at the budget of the other six, so that all eight learners are paired on B3's test tasks
sweep cpu_3200.flags maml_high,sca B3 0 cpu_3200
echo "=== $(date -u +%FT%TZ) the CPU reference grid is complete"
