#!/usr/bin/env bash
# The packed-training rows a GPU lease measures (issue 28), in two phases, so that one lease
# measures many programs although each takes 20-120 s to compile:
#
#   benchmarks/gpu_rows.sh OUT_DIR SECONDS
#
# 1. Compile. Each row's program is compiled into one persistent compilation cache by
#    `benchmarks/accelerator.py --kinds=pack --compile_only` processes, JOBS (default 12) side by
#    side, one process per line and pack size K, started in the list's order. Compilation is
#    host work: one process leaves most of the host's cores idle while the lease is paid by
#    the second. Beside them run the AGREEMENT checks (`benchmarks/pack_agreement.py`: how far a
#    pack and S steps per call land from the solo run on this backend) and, when TESTS names
#    pytest arguments, those tests on this backend. The phase ends when all are done or at
#    COMPILE_SHARE % (default 50) of SECONDS; what is still running then is stopped.
# 2. Time. Each line's rows are timed by one accelerator.py process after another, alone on the
#    device and the host, their programs read from the cache (each row says `from_cache`); a
#    line is cut at its cap or at the deadline (SIGINT: its complete rows stay).
#
# ROWS replaces the list of lines (a cap in seconds and one call's flags per line; every call
# gets --kinds=pack --cells=B3 --pack_steps=10 --repeats=3 first, which a line's flags
# override). Rows go to OUT_DIR/rows.jsonl (one JSON line each: device, precision, jax version,
# compile seconds, XLA's memory estimate, rates), the compile phase's to compile.jsonl, the
# agreement rows to agreement.jsonl; readable lines to rows.log, compile.log, agreement.log and
# tests.log. PYTHON names the interpreter; CFSL_COMMIT the commit where the copy has no git.
# docs/results.md ("fifth lease") holds what one 15-minute lease gave.
set -uo pipefail
if [[ $# -ne 2 ]]; then
  echo "usage: $0 OUT_DIR SECONDS" >&2
  exit 2
fi
if ! [[ ${2} =~ ^[1-9][0-9]*$ ]]; then
  echo "error: SECONDS=${2}: give the wall time as a whole number of seconds, at least 1" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "$1"); total=$2; start=$SECONDS
cache=$(mktemp -d "${TMPDIR:-/tmp}/cfsl_gpu_rows_cache.XXXX")
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
commit=${CFSL_COMMIT:-$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)}
compile_end=$(( total * ${COMPILE_SHARE:-50} / 100 ))
quiet() { grep --line-buffered -v "^[IW][0-9]\|^$"; }
note() { echo "=== +$((SECONDS - start))s $*" | tee -a "$out/rows.log"; }
note "$(date -u +%FT%TZ) commit $commit, $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo no GPU)"
default_rows="60 --pack_learners=maml_low --packs=1,8
150 --pack_learners=sca --packs=3,8,16
150 --pack_learners=maml_high --packs=1,3,8,16
90 --pack_learners=maml_low --packs=3,8,16 --synthetic_colour
120 --pack_learners=maml_low --cells=B10 --packs=1,3,8,16
60 --pack_learners=protonets --cells=B10 --packs=1,3,8,16
150 --pack_learners=sca --cells=B10 --packs=1,3,8,16
150 --pack_learners=maml_high --cells=B10 --packs=1,3,8,16
60 --pack_learners=pretrain_tune --cells=B3,B10 --packs=1,3,16 --pack_steps=1
40 --pack_learners=protonets --packs=8,16
60 --pack_learners=sca --packs=1,16 --pack_steps=1
60 --pack_learners=maml_high --packs=1,16 --pack_steps=1"
rows=${ROWS:-$default_rows}
bench=("$python" "$root/benchmarks/accelerator.py" --kinds=pack --cells=B3 --pack_steps=10
       --repeats=3 --compilation_cache_dir="$cache")  # then a line's flags, which override

# 1. compile, side by side (no preallocation: the processes share the device's memory)
export XLA_PYTHON_CLIENT_PREALLOCATE=false
note "1. compiling into $cache, ${JOBS:-12} at a time, until +${compile_end}s"
: "${AGREEMENT=--learners=protonets --pack=3 --steps=20 --steps_per_dispatch=10 --test_tasks=100
--learners=maml_low --pack=3 --steps=20 --steps_per_dispatch=10 --test_tasks=100}"
while read -r flags; do
  [[ -z $flags ]] && continue
  # shellcheck disable=SC2086
  "$python" "$root/benchmarks/pack_agreement.py" $flags >> "$out/agreement.jsonl" \
    2> >(quiet | grep --line-buffered -v "^\[test\]" >> "$out/agreement.log") &
done <<< "$AGREEMENT"
if [[ -n ${TESTS:-} ]]; then
  # shellcheck disable=SC2086
  (cd "$root" && exec "$python" -m pytest -o addopts="" -p no:cacheprovider -q -n 0 $TESTS \
    > "$out/tests.log" 2>&1) &
fi
background=$(jobs -rp | wc -l)
while read -r cap flags; do
  [[ -z $cap ]] && continue
  packs=$(grep -o -- "--packs=[0-9,]*" <<< "$flags" | tail -n 1 | cut -d= -f2)
  for k in ${packs//,/ }; do
    while (( $(jobs -rp | wc -l) >= ${JOBS:-12} + background && SECONDS - start < compile_end )); do
      wait -n
    done
    (( SECONDS - start >= compile_end )) && break 2
    # shellcheck disable=SC2086
    "${bench[@]}" $flags --packs="$k" --compile_only >> "$out/compile.jsonl" \
      2> >(quiet >> "$out/compile.log") &
  done
done <<< "$rows"
while (( $(jobs -rp | wc -l) > 0 && SECONDS - start < compile_end )); do
  sleep 2
done
if (( $(jobs -rp | wc -l) > 0 )); then
  note "stopping $(jobs -rp | wc -l) process(es) still compiling or checking at the phase's end"
  kill -INT $(jobs -rp) 2>/dev/null; sleep 5; kill -KILL $(jobs -rp) 2>/dev/null
fi
wait
count() { grep -c "$1" "$2" 2>/dev/null || true; }
note "compiled: $(count compile_only "$out/compile.jsonl") program(s), $(count '"error"' "$out/compile.jsonl") error row(s)"
unset XLA_PYTHON_CLIENT_PREALLOCATE

# 2. time, one line after another, alone
while read -r cap flags; do
  [[ -z $cap ]] && continue
  left=$(( total - 15 - (SECONDS - start) ))
  if (( left < 20 )); then
    note "2. skipped (${left}s left): $flags"
    continue
  fi
  (( cap > left )) && cap=$left
  note "2. at most ${cap}s: $flags"
  # shellcheck disable=SC2086
  timeout -s INT -k 10 "$cap" "${bench[@]}" $flags --out="$out/rows.jsonl" \
    2>&1 >/dev/null | quiet >> "$out/rows.log"
done <<< "$rows"
rm -rf "$cache"
note "done"
cat "$out/rows.log"
