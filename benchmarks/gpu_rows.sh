#!/usr/bin/env bash
# The packed-training rows a GPU lease measures first (issue 28), in order of need, one
# process at a time, each cut at its share of a deadline:
#
#   benchmarks/gpu_rows.sh OUT_DIR SECONDS
#
# 0. AGREEMENT (each line, pack_agreement.py's flags; "" skips it): how far a pack and S
#    steps per call land from the solo run on this backend, at most AGREEMENT_S seconds for
#    all lines (default 240: MAML++ L's pack of 3 against its solo runs, not yet measured on a
#    GPU, compiles four MAML-family programs; then, if time is left, a ProtoNets pack of three
#    learning rates);
# then the rows, each line one `benchmarks/accelerator.py --kinds=pack` call:
# 1. MAML++ H: B3 K = 8 and solo, B10 K = 1, 3;
# 2. SCA B10 K = 3, MAML++ L B10 solo (S=10), the pretraining step on B10;
# 3. MAML++ L B3 on SlimageNet64-sized images (--synthetic_colour: 64x64x3) at K = 8;
# 4. K = 16 for SCA, MAML++ H and ProtoNets, with whatever time is left.
# (The fourth to sixth leases gave the other rows: docs/results.md.)
# One at a time: the fifth lease compiled 12 programs side by side into a shared persistent
# cache, and each took 4-8x longer than alone (MAML++ L B3 K=1 170 s, K=8 252 s, against
# 18-46 s alone on earlier leases: XLA's GPU compiler already uses the host's cores, and its
# autotuning runs on the one GPU), so nothing was gained. A MAML-family program took 44-75 s
# to compile alone on the fourth to sixth leases: a cap allows about 80 s per program.
# Rows (one JSON line each, with the device, precision, jax version, compile seconds and
# XLA's memory estimate) are appended to OUT_DIR/rows.jsonl, readable lines go to
# OUT_DIR/rows.log; the agreement's to agreement.jsonl and agreement.log. A call reaching its
# cap is stopped with SIGINT: its complete rows stay. ROWS replaces the list (a cap in seconds
# and one call's flags per line, after the defaults --kinds=pack --cells=B3 --pack_steps=10
# --repeats=3, which a line's flags override); PYTHON names the interpreter; CFSL_COMMIT the
# commit where the copy has no git. docs/results.md ("sixth lease") holds the last lease's rows.
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
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
commit=${CFSL_COMMIT:-$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)}
quiet() { grep --line-buffered -v "^[IW][0-9]\|^$\|^\[test\]\|^\[generating"; }
note() { echo "=== +$((SECONDS - start))s $*" | tee -a "$out/rows.log"; }
note "$(date -u +%FT%TZ) commit $commit, $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo no GPU)"

: "${AGREEMENT=--learners=maml_low --pack=3 --steps=20 --steps_per_dispatch=10 --test_tasks=100
--learners=protonets --learning_rates=0.001,0.003,0.0003 --steps=20 --steps_per_dispatch=10 --test_tasks=100}"
agreement_end=$(( SECONDS + ${AGREEMENT_S:-240} ))
while read -r flags; do
  [[ -z $flags ]] && continue
  left=$(( agreement_end - SECONDS ))
  (( left < 20 )) && { note "0. agreement skipped (${left}s left): $flags"; continue; }
  note "0. agreement, at most ${left}s: $flags"
  # shellcheck disable=SC2086  # flags is a list of flags
  timeout -s INT -k 10 "$left" "$python" "$root/benchmarks/pack_agreement.py" $flags \
    >> "$out/agreement.jsonl" 2> >(quiet >> "$out/agreement.log")
done <<< "$AGREEMENT"

default_rows="200 --pack_learners=maml_high --packs=1,8
170 --pack_learners=maml_high --cells=B10 --packs=1,3
90 --pack_learners=sca --cells=B10 --packs=3
80 --pack_learners=maml_low --cells=B10 --packs=1
40 --pack_learners=pretrain_tune --cells=B10 --packs=1,3 --pack_steps=1
100 --pack_learners=maml_low --packs=8 --synthetic_colour
9999 --pack_learners=sca,maml_high,protonets --packs=16"
while read -r cap flags; do
  [[ -z $cap ]] && continue
  left=$(( total - 10 - (SECONDS - start) ))
  if (( left < 30 )); then
    note "skipped (${left}s left): $flags"
    continue
  fi
  (( cap > left )) && cap=$left
  note "at most ${cap}s: $flags"
  # shellcheck disable=SC2086  # flags is a list of flags
  timeout -s INT -k 10 "$cap" "$python" "$root/benchmarks/accelerator.py" --kinds=pack \
    --cells=B3 --pack_steps=10 --repeats=3 $flags --out="$out/rows.jsonl" \
    2>&1 >/dev/null | quiet >> "$out/rows.log"
done <<< "${ROWS:-$default_rows}"
cat "$out/rows.log" "$out/agreement.log" 2>/dev/null
