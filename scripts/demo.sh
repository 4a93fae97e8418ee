#!/usr/bin/env bash
# The main job on the shipped sample model: export -> quantize (every INT8 method) -> generate -> compare.
# Usage: bash scripts/demo.sh [OUT_DIR]   (default out/demo; it is replaced on each run)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
OUT=${1:-out/demo}
G=.venv/bin/gptedge
step() { printf '\n== %s\n' "$*" >&2; }

step "export samples/sample-model -> $OUT/fp32 (validated against the PyTorch reference)"
$G export samples/sample-model -o "$OUT/fp32" --force
step "quantize: dynamic INT8 (s8 per-channel weights, u8 activations at run time)"
$G quantize "$OUT/fp32" -o "$OUT/int8-dynamic" --method dynamic --force
step "quantize: static INT8 (QDQ, calibrated on samples/calibration/emma_ch1-4.txt)"
$G quantize "$OUT/fp32" -o "$OUT/int8-static" --method static --calibration samples/calibration/emma_ch1-4.txt --force
step "quantize: weight-only INT8 (MatMulNBits, blocks of 32)"
$G quantize "$OUT/fp32" -o "$OUT/int8-weight-only" --method weight-only --force
PROMPT="It is a truth universally acknowledged, that"
step "generate with top-k sampling from the weight-only INT8 model; the prompt: $PROMPT"
$G generate "$OUT/int8-weight-only" -p "$PROMPT" -n 80 --top-k 40 --temperature 0.8 --seed 0 --device cpu
step "compare every variant on held-out text (samples/eval/persuasion_ch1-7.txt)"
$G compare "$OUT/fp32" "$OUT/int8-dynamic" "$OUT/int8-static" "$OUT/int8-weight-only" \
  --text samples/eval/persuasion_ch1-7.txt --markdown "$OUT/compare.md" --plot "$OUT/compare.png"
step "done: $OUT/compare.md and $OUT/compare.png"
