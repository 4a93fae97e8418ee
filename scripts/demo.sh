#!/usr/bin/env bash
# The main job on the shipped sample model: export -> quantize (every INT8 method) -> generate -> compare;
# then the sample classifier: export --task classification -> quantize -> classify.
# Usage: bash scripts/demo.sh [OUT_DIR]   (default out/demo; it is replaced on each run)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh demo  # only what the demo needs: no test extra, Ray, node_modules or Chromium
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

# The sample classifier (samples/sample-classifier: which Austen novel a 40-word passage comes from; 79.6 % held out).
step "export samples/sample-classifier -> $OUT/cls-fp32 (--task classification, validated against the reference)"
$G export samples/sample-classifier -o "$OUT/cls-fp32" --task classification --force
step "quantize the classifier: weight-only INT8 and dynamic INT8 (the head's linear stays fp32)"
$G quantize "$OUT/cls-fp32" -o "$OUT/cls-weight-only" --method weight-only --force
$G quantize "$OUT/cls-fp32" -o "$OUT/cls-dynamic" --method dynamic --force
# two held-out passages (lines 224 and 313 of samples/eval/austen-novel.jsonl: northanger-abbey, pride-and-prejudice)
sed -n '224p;313p' samples/eval/austen-novel.jsonl > "$OUT/cls-passages.jsonl"
for variant in cls-fp32 cls-weight-only cls-dynamic; do
  step "classify two held-out passages with $variant (label, probability, the others)"
  $G classify "$OUT/$variant" --jsonl "$OUT/cls-passages.jsonl" --device cpu
done
step "compare the classifiers on the 500 held-out passages (samples/eval/austen-novel.jsonl): accuracy, agreement and KL with fp32, confusion, examples/s"
$G compare "$OUT/cls-fp32" "$OUT/cls-weight-only" "$OUT/cls-dynamic" --labelled samples/eval/austen-novel.jsonl \
  --repeats 1 --markdown "$OUT/compare-classifier.md"
step "done: $OUT/compare.md, $OUT/compare.png and $OUT/compare-classifier.md"
