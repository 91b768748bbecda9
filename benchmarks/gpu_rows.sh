#!/usr/bin/env bash
# The packed-training rows a GPU lease measures first (issue 28), in order of need, each
# `benchmarks/accelerator.py --kinds=pack` call cut at its share of a deadline:
#
#   benchmarks/gpu_rows.sh OUT_DIR SECONDS
#
# 1. SCA B3 at K = 3 (its solo row is in docs/results.md, "fourth lease");
# 2. MAML++ H B3: K = 1, 3;
# 3. MAML++ L B3 on SlimageNet64-sized images (--synthetic_colour: 64x64x3) at K = 3;
# 4. MAML++ L B10: K = 1, 3 (the dearest cell), with whatever time is left.
# The fourth lease measured ProtoNets' convolutions and MAML++ L at K = 1, 3 (ROWS below brings
# them back). A MAML-family program took 44-74 s to compile there: caps allow about 90 s each.
# Rows (one JSON line each, with the device, precision, jax version, compile seconds and
# XLA's memory estimate) are appended to OUT_DIR/rows.jsonl, readable lines go to
# OUT_DIR/rows.log. A call reaching its cap is stopped with SIGINT: its complete rows stay.
# ROWS replaces the list (a cap in seconds and one call's flags per line; the fourth lease's:
#   ROWS="90 --pack_learners=protonets --packs=1,3,16 --learner_option=conv=gemm_grad
#   60 --pack_learners=protonets --packs=1,3 --learner_option=conv=im2col ..."); PYTHON names the
# interpreter; CFSL_COMMIT the commit where the copy has no git.
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
commit=${CFSL_COMMIT:-$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)}
echo "=== $(date -u +%FT%TZ) commit $commit, $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo no GPU)" >> "$out/rows.log"
default_rows="150 --pack_learners=sca --packs=3
200 --pack_learners=maml_high --packs=1,3
120 --pack_learners=maml_low --packs=3 --synthetic_colour
9999 --pack_learners=maml_low --cells=B10 --packs=1,3"
while read -r cap flags; do
  [[ -z $cap ]] && continue
  left=$(( total - (SECONDS - start) ))
  if (( left < 30 )); then
    echo "=== +$((SECONDS - start))s skipped (${left}s left): $flags" | tee -a "$out/rows.log"
    continue
  fi
  (( cap > left )) && cap=$left
  echo "=== +$((SECONDS - start))s at most ${cap}s: $flags" | tee -a "$out/rows.log"
  # shellcheck disable=SC2086  # flags is a list of flags
  timeout -s INT -k 10 "$cap" "${PYTHON:-python3}" "$root/benchmarks/accelerator.py" \
    --kinds=pack --cells=B3 --pack_steps=10 --repeats=5 $flags --out="$out/rows.jsonl" \
    2>&1 >/dev/null | grep -v "^[IW][0-9]\|^$" >> "$out/rows.log"
done <<< "${ROWS:-$default_rows}"
cat "$out/rows.log"
