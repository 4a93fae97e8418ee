#!/usr/bin/env bash
# The main job on the shipped sample model: export -> quantize (every INT8 method) -> generate -> compare;
# then the Llama sample: export -> quantize (weight-only 8 and 4-bit) -> generate -> compare, one chat turn through
# serve; then the sample classifier: export --task classification -> quantize -> classify.
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

# The Llama sample (samples/sample-llama: GQA, untied head, its own byte-fallback BPE, a ChatML template).
step "export samples/sample-llama -> $OUT/llama-fp32 (validated against the PyTorch reference)"
$G export samples/sample-llama -o "$OUT/llama-fp32" --force
step "quantize the Llama sample: weight-only INT8 and 4-bit (MatMulNBits, blocks of 32)"
$G quantize "$OUT/llama-fp32" -o "$OUT/llama-int8" --method weight-only --force
$G quantize "$OUT/llama-fp32" -o "$OUT/llama-int4" --method weight-only --bits 4 --force
step "generate from the Llama sample's 4-bit variant; the prompt: $PROMPT"
$G generate "$OUT/llama-int4" -p "$PROMPT" -n 60 --top-k 40 --temperature 0.8 --seed 0 --device cpu
step "compare the Llama sample's variants on the same held-out text"
$G compare "$OUT/llama-fp32" "$OUT/llama-int8" "$OUT/llama-int4" --text samples/eval/persuasion_ch1-7.txt \
  --max-tokens 8192 --prompts 4 --markdown "$OUT/compare-llama.md"
step "one chat turn through gptedge serve (POST /v1/chat/completions, the checkpoint's own chat template)"
PORT=$(.venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
$G serve "$OUT/llama-int8" --port "$PORT" --device cpu --max-batch 1 --model-name llama-sample 2> "$OUT/serve.log" &
SERVER=$!
trap 'kill "$SERVER" 2> /dev/null || true' EXIT  # no server left behind, whatever fails below
.venv/bin/python - "$PORT" <<'CHAT'
import json, sys, time, urllib.error, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}"
for _ in range(120):  # the server loads the model first
    try:
        urllib.request.urlopen(base + "/health", timeout=1)
        break
    except (urllib.error.URLError, OSError):
        time.sleep(0.5)
else:
    sys.exit("gptedge serve did not come up: see serve.log")
messages = [{"role": "user", "content": "Will you walk with me to Highbury this morning?"}]
body = json.dumps({"model": "llama-sample", "messages": messages, "max_tokens": 60, "temperature": 0.8, "top_p": 0.95,
                   "seed": 0}).encode()
request = urllib.request.Request(base + "/v1/chat/completions", body, {"Content-Type": "application/json"})
try:
    reply = json.load(urllib.request.urlopen(request, timeout=60))
except urllib.error.HTTPError as e:
    sys.exit(f"POST /v1/chat/completions: {e.code} {e.read().decode(errors='replace')}")
print("user:     ", messages[0]["content"])
print("assistant:", reply["choices"][0]["message"]["content"], f"[{reply['choices'][0]['finish_reason']}]")
CHAT
kill "$SERVER" && wait "$SERVER" 2> /dev/null || true
trap - EXIT

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
step "done: $OUT/compare.md, $OUT/compare.png, $OUT/compare-llama.md and $OUT/compare-classifier.md"
