#!/usr/bin/env bash
# One GPU lease, prepared to fit a deadline: the paper-budget ProtoNets B3 pack
# (issue 29: seeds 0,1,2 as one program at --budget=paper) and then the packed
# training rows of benchmarks/packing.py (issue 28), each cut at its share of the time.
#
#   benchmarks/reference/run_gpu.sh OUT_DIR MANUAL_DIR DATA_DIR SECONDS
#
# OUT_DIR: where the logs, the benchmark's JSON lines and the sweep folder's tar go;
# MANUAL_DIR: full Omniglot's two zips; DATA_DIR: the prepared TFDS data (as
# run_cpu.sh's); SECONDS: the wall time the whole script may take. The pack gets
# RUN_SHARE % of it (default 65) and is then stopped with SIGTERM (each run
# checkpoints; run the same command on that folder to continue: it resumes
# exactly); the benchmark rows get the rest, less TAIL seconds (default 25) kept for
# packing up. RUN_FLAGS adds flags to the pack's launch.train (a CPU dry run
# shrinks it with them); BENCH_FLAGS replaces the benchmark's; CFSL_COMMIT names the
# commit where the copy has no git; PYTHON the interpreter (default python3). The sweep folder
# (OUT_DIR/sweep: SWEEP/omniglot-full/protonets/B3/seedS, the CPU grid's layout)
# is archived as sweep.tar.gz, in 15 MB pieces when larger; export its rows with
# `python -m benchmarks.reference.export --sweep_dir=...`.
#
# On a bare GPU machine with jax (CUDA) installed and no network, install the
# checkout first, without dependencies, and whatever else is missing from wheels
# carried along (the 2026-11-27 lease: tensorflow-datasets, array-record, dm-tree,
# immutabledict, importlib_resources, promise, simple_parsing, docstring_parser,
# tensorflow-metadata, googleapis-common-protos, termcolor, toml, tensorboardX):
#   pip install --no-index --no-deps --target /tmp/site WHEELS/*.whl && export PYTHONPATH=/tmp/site
#   pip install --no-index --no-deps --no-build-isolation -e .
#   CFSL_COMMIT=$(git rev-parse HEAD) benchmarks/reference/run_gpu.sh $OUT MANUAL DATA 555
# (docs/results.md, "third lease": what one 15-minute lease gave). To continue a
# stopped pack on another machine, unpack its sweep.tar.gz into the new OUT_DIR
# first: the same command resumes each run from its checkpoints.
set -uo pipefail
if [[ $# -ne 4 ]]; then
  echo "usage: $0 OUT_DIR MANUAL_DIR DATA_DIR SECONDS" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$(realpath -m "$1"); manual=$(realpath -m "$2"); data=$(realpath -m "$3"); total=$4
start=$SECONDS
tail_s=${TAIL:-25}
run_s=$(( (total - tail_s) * ${RUN_SHARE:-65} / 100 ))
sweep=$out/sweep
workdir=$sweep/omniglot-full/protonets/B3
mkdir -p "$workdir"
commit=${CFSL_COMMIT:-$(git -C "$root" rev-parse HEAD 2>/dev/null || cat "$root/COMMIT" 2>/dev/null || echo unknown)}
python=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
note() { echo "=== $(date -u +%FT%TZ) +$((SECONDS - start))s $*"; }

note "device: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || echo none), commit $commit"
printf '{"start": "%s", "commit": "%s", "flagfile": "gpu paper", "learners": "protonets", "cell": "B3", "seeds": "0,1,2"}\n' \
  "$(date -u +%FT%TZ)" "$commit" >> "$sweep/provenance.jsonl"

note "1. ProtoNets B3 at --budget=paper, seeds 0,1,2 as one pack, at most ${run_s}s"
# shellcheck disable=SC2086  # RUN_FLAGS is a list of flags
timeout -s TERM -k 40 "$run_s" "$python" -m launch.train --workdir="$workdir" --seeds=0,1,2 \
  --learner=protonets --task=B3 --budget=paper --steps_per_dispatch=50 \
  --dataset=omniglot/full --dataset_option=class_split=authors --eval_seed=0 \
  --manual_dir="$manual" --data_dir="$data" ${RUN_FLAGS:-} 2>&1 | tee "$out/paper_run.log" \
  | grep -vE "still|steps \(|\] epoch [0-9]*[1-9]:"  # every 10th epoch's line
note "the pack exited ${PIPESTATUS[0]}"

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
