#!/usr/bin/env bash
# GPTQ-style rounding (issue #36, --gptq): KL(fp32||q) at equal bytes of the plain weight-only recipes against the
# same layouts with --scale-search mse, --gptq (calibrated on samples/calibration/emma_ch1-4.txt) and both, 4-bit
# (default blocks of 32) and 8-bit, on one checkpoint; VARIANTS=1 adds GPTQ's other grids at 4 bits (static scales:
# every block's grid from the original weights; act-order: K rounded by decreasing H diagonal, static scales) by
# setting quantize/gptq.py's switches. One `gptedge compare` table on the eval text (accuracy only: compare's tok/s
# column is a single short prompt, not a measurement).
#   bash benchmarks/run_gptq.sh CHECKPOINT WORK_DIR        (results: benchmarks/results/quantizers-2026-11-26b.md)
set -euo pipefail
cd "$(dirname "$0")/.."
CK=${1:?checkpoint}
W=${2:?work dir}
TEXT=${TEXT:-samples/eval/persuasion_ch1-7.txt}
CAL=${CAL:-samples/calibration/emma_ch1-4.txt}
G=${GPTEDGE:-.venv/bin/gptedge}
PY=${PYTHON:-.venv/bin/python}
mkdir -p "$W"
x() { [ -f "$W/$1/gptedge.json" ] || "${@:2}" > /dev/null; }
x fp32 $G export "$CK" -o "$W/fp32" --graph kv_buffer
dirs=(fp32)
for bits in 4 8; do
  for search in plain mse gptq gptq-mse; do
    name=wo$bits-$search
    args=(--bits "$bits")
    case $search in mse) args+=(--scale-search mse);; gptq) args+=(--gptq --calibration "$CAL");;
      gptq-mse) args+=(--gptq --scale-search mse --calibration "$CAL");; esac  # only --gptq reads the text
    x "$name" $G quantize "$W/fp32" -o "$W/$name" --method weight-only "${args[@]}"
    dirs+=("$name")
  done
done
if [ -n "${VARIANTS:-}" ]; then
  for v in static actorder; do
    setting=$([ $v = static ] && echo "g.STATIC_SCALES = True" || echo "g.ACT_ORDER = True")
    x "wo4-gptq-$v" $PY -c "import sys; import gptedge.quantize.gptq as g; $setting
from gptedge.cli import main; sys.argv[0] = 'gptedge'; main()" quantize "$W/fp32" -o "$W/wo4-gptq-$v" \
      --method weight-only --bits 4 --gptq --calibration "$CAL"
    dirs+=("wo4-gptq-$v")
  done
fi
$G compare "${dirs[@]/#/$W/}" --text "$TEXT" --max-tokens "${MAX_TOKENS:-2048}" --prompts 1 --prompt-tokens 8 \
  --new-tokens 8 --threads 1 --device cpu --markdown "$W/gptq.md" > /dev/null
cat "$W/gptq.md"
