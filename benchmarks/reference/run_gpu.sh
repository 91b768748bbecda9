#!/usr/bin/env bash
# One GPU lease, prepared to fit a deadline: paper-budget packs of the reference grid
# (issue 29: each learner and cell's seeds as one program at --budget=paper), then the
# packed training rows of benchmarks/packing.py (issue 28), each cut at its share of time.
#
#   [PACKS="protonets:B3 protonets:A3"] benchmarks/reference/run_gpu.sh OUT_DIR MANUAL_DIR DATA_DIR SECONDS
#
# OUT_DIR: where the logs, the benchmark's JSON lines and the sweep folder's tar go;
# MANUAL_DIR: full Omniglot's two zips; DATA_DIR: the prepared TFDS data (as
# run_cpu.sh's); SECONDS: the wall time the whole script may take.
# PACKS (default "protonets:A3 protonets:C3 protonets:D4 maml_low:B3", issue 29's order after
# ProtoNets B3, done on the third lease): LEARNER:CELL items, trained one after another, each
# a pack of SEEDS (default 0,1,2) with STEPS steps per call (default 50). Together
# they get RUN_SHARE % of the time (default 65); the pack running at the deadline is
# stopped with SIGTERM (each run checkpoints) and the later ones are left for the next
# lease. RESUME: a sweep.tar.gz (or its first 15 MB piece, sweep.tar.gz.00) that an
# earlier lease brought back, unpacked first: finished runs are skipped, stopped ones
# resume exactly. The benchmark rows get the rest, less TAIL seconds (default 25) kept
# for packing up. RUN_FLAGS adds flags to each pack's launch.train (a CPU dry run
# shrinks it with them); BENCH_FLAGS replaces the benchmark's; CFSL_COMMIT names the
# commit where the copy has no git; PYTHON the interpreter (default python3).
# The sweep folder (OUT_DIR/sweep: SWEEP/omniglot-full/LEARNER/CELL/seedS, the CPU
# grid's layout) is archived as sweep.tar.gz, in 15 MB pieces when larger; export its
# rows with `python -m benchmarks.reference.export --sweep_dir=...`.
#
# On a bare GPU machine with jax (CUDA) installed and no network, install the
# checkout first, without dependencies, and whatever else is missing from wheels
# carried along (the 2026-11-27 lease: tensorflow-datasets, array-record, dm-tree,
# immutabledict, importlib_resources, promise, simple_parsing, docstring_parser,
# tensorflow-metadata, googleapis-common-protos, termcolor, toml, tensorboardX):
#   pip install --no-index --no-deps --target /tmp/site WHEELS/*.whl && export PYTHONPATH=/tmp/site
#   pip install --no-index --no-deps --no-build-isolation -e .
#   CFSL_COMMIT=$(git rev-parse HEAD) benchmarks/reference/run_gpu.sh $OUT MANUAL DATA 555
# A lease measures benchmarks/gpu_rows.sh's missing packed rows first (issue 28), then this.
# (docs/results.md, "third lease": what one 15-minute lease gave).
set -uo pipefail
if [[ $# -ne 4 ]]; then
  echo "usage: $0 OUT_DIR MANUAL_DIR DATA_DIR SECONDS" >&2
  exit 2
fi
if ! [[ ${4} =~ ^[1-9][0-9]*$ ]]; then
  echo "error: SECONDS=${4}: give the wall time as a whole number of seconds, at least 1" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$(realpath -m "$1"); manual=$(realpath -m "$2"); data=$(realpath -m "$3"); total=$4
start=$SECONDS
tail_s=${TAIL:-25}
run_end=$(( (total - tail_s) * ${RUN_SHARE:-65} / 100 ))
sweep=$out/sweep
mkdir -p "$sweep"
commit=${CFSL_COMMIT:-$(git -C "$root" rev-parse HEAD 2>/dev/null || cat "$root/COMMIT" 2>/dev/null || echo unknown)}
python=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
note() { echo "=== $(date -u +%FT%TZ) +$((SECONDS - start))s $*"; }

note "device: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || echo none), commit $commit"
if [[ -n ${RESUME:-} ]]; then  # an earlier lease's folder (pieces joined), then resumed
  cat "${RESUME%.00}"* | tar -C "$out" -xzf - && note "unpacked $RESUME"
fi

for item in ${PACKS:-protonets:A3 protonets:C3 protonets:D4 maml_low:B3}; do
  learner=${item%%:*}; cell=${item##*:}
  left=$(( run_end - (SECONDS - start) ))
  if (( left < 60 )); then
    note "1. $learner $cell: left for a later lease (${left}s of the packs' share remain)"
    continue
  fi
  printf '{"start": "%s", "commit": "%s", "flagfile": "gpu paper", "learners": "%s", "cell": "%s", "seeds": "%s"}\n' \
    "$(date -u +%FT%TZ)" "$commit" "$learner" "$cell" "${SEEDS:-0,1,2}" >> "$sweep/provenance.jsonl"
  note "1. $learner $cell at --budget=paper, seeds ${SEEDS:-0,1,2} as one pack, at most ${left}s"
  # shellcheck disable=SC2086  # RUN_FLAGS is a list of flags
  timeout -s TERM -k 40 "$left" "$python" -m launch.train \
    --workdir="$sweep/omniglot-full/$learner/$cell" --seeds="${SEEDS:-0,1,2}" \
    --learner="$learner" --task="$cell" --budget=paper --steps_per_dispatch="${STEPS:-50}" \
    --dataset=omniglot/full --dataset_option=class_split=authors --eval_seed=0 \
    --manual_dir="$manual" --data_dir="$data" ${RUN_FLAGS:-} 2>&1 \
    | tee -a "$out/paper_run.log" | grep -vE "still|steps \(|\] epoch [0-9]*[1-9]:|^\[val\] 600"
  note "the pack exited ${PIPESTATUS[0]}"
done

bench_s=$(( total - tail_s - (SECONDS - start) ))
note "2. packed training rows, at most ${bench_s}s"
if (( bench_s > 30 )); then
  # shellcheck disable=SC2086
  timeout -s TERM -k 10 "$bench_s" "$python" "$root/benchmarks/packing.py" \
    ${BENCH_FLAGS:---learners=maml_low,protonets --cells=B3 --packs=1,16 --steps_per_dispatch=1,10 --calls=20} \
    > "$out/packing.jsonl" 2> "$out/packing.log"
  note "the benchmark exited $?"
  grep -v "^I0\|^W0\|^$" "$out/packing.log" | tail -n 20
fi

note "3. packing up"
tar -C "$out" -czf "$out/sweep.tar.gz" sweep
if (( $(stat -c %s "$out/sweep.tar.gz") > 15000000 )); then
  split -b 15000000 -d "$out/sweep.tar.gz" "$out/sweep.tar.gz."
  rm "$out/sweep.tar.gz"
fi
rm -rf "$sweep"
ls -la "$out"
note "done"
