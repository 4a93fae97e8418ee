#!/usr/bin/env bash
# Error-aware weight quantizers (issue #36): KL(fp32||q) at equal bytes of the plain weight-only recipes against the
# same layouts with --scale-search mse, --awq (calibrated on samples/calibration/emma_ch1-4.txt) and both, 4-bit and
# 8-bit blocks of 32, with and without the int8 KV cache, on one checkpoint; one `gptedge compare` table on the
# eval text (accuracy only: compare's decode tok/s column is a single short prompt and is not a measurement).
#   bash benchmarks/run_quantizers.sh CHECKPOINT WORK_DIR        (results: benchmarks/results/quantizers-*.md)
set -euo pipefail
cd "$(dirname "$0")/.."
CK=${1:?checkpoint}
W=${2:?work dir}
TEXT=${TEXT:-samples/eval/persuasion_ch1-7.txt}
CAL=${CAL:-samples/calibration/emma_ch1-4.txt}
G=${GPTEDGE:-.venv/bin/gptedge}
mkdir -p "$W"
x() { [ -f "$W/$1/gptedge.json" ] || "${@:2}" > /dev/null; }
x fp32 $G export "$CK" -o "$W/fp32" --graph kv_buffer
dirs=(fp32)
for bits in 4 8; do
  for search in plain mse awq mse-awq; do
    for cache in "" -kv8; do
      name=wo$bits-$search$cache
      args=(--bits "$bits")
      case $search in mse) args+=(--scale-search mse);; awq) args+=(--awq);; mse-awq) args+=(--scale-search mse --awq);; esac
      [ -z "$cache" ] || args+=(--kv-cache int8)
      # --calibration only where something reads it (quantize refuses an option that does nothing)
      [[ "$search" != *awq* && -z "$cache" ]] || args+=(--calibration "$CAL")
      x "$name" $G quantize "$W/fp32" -o "$W/$name" --method weight-only "${args[@]}"
      dirs+=("$name")
    done
  done
done
$G compare "${dirs[@]/#/$W/}" --text "$TEXT" --max-tokens "${MAX_TOKENS:-2048}" --prompts 1 --prompt-tokens 8 \
  --new-tokens 8 --threads 1 --device cpu --markdown "$W/quantizers.md" > /dev/null
cat "$W/quantizers.md"
