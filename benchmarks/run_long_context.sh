#!/usr/bin/env bash
# The two-context frontier (issue #23): gptedge's recipes, with and without a quantized KV cache, next to
# llama.cpp's Q8_0 / Q4_K_M / Q4_0, decode tok/s at 32 + 128 and at 896 + 128 tokens (batch 1, 2 threads, 8
# greedy prompts from the text), each context run twice back to back, every engine timed by `compare` the
# same way. Run on a quiet machine.
#   GPTEDGE_LLAMA_CPP_SOURCE=DIR/llama_cpp_python-0.3.36.tar.gz bash benchmarks/run_long_context.sh CHECKPOINT WORK_DIR
# CHECKPOINT: an HF GPT-2 checkpoint (benchmarks/make_gpt2_small.py makes the GPT-2 small shape); WORK_DIR gets
# the dirs and compare-{32,896}-{1,2}.md. TEXT (default the sample excerpt) gives prompts and accuracy windows;
# MAX_TOKENS (default 2048) caps the accuracy windows (the speed columns are what this script is for).
set -euo pipefail
cd "$(dirname "$0")/.."
CK=${1:?checkpoint}
W=${2:?work dir}
TEXT=${TEXT:-samples/eval/persuasion_ch1-7.txt}
CAL=${CAL:-samples/calibration/emma_ch1-4.txt}
G=${GPTEDGE:-.venv/bin/gptedge}
mkdir -p "$W"
x() { [ -f "$W/$1/gptedge.json" ] || "${@:2}"; }
x fp32 $G export "$CK" -o "$W/fp32" --graph kv_buffer
x wo8 $G quantize "$W/fp32" -o "$W/wo8" --method weight-only
x wo8-kv8 $G quantize "$W/fp32" -o "$W/wo8-kv8" --method weight-only --kv-cache int8 --calibration "$CAL"
x wo8b16-kv8 $G quantize "$W/fp32" -o "$W/wo8b16-kv8" --method weight-only --block-size 16 --kv-cache int8 --calibration "$CAL"
x wo4 $G quantize "$W/fp32" -o "$W/wo4" --method weight-only --bits 4
x wo4-kv8 $G quantize "$W/fp32" -o "$W/wo4-kv8" --method weight-only --bits 4 --kv-cache int8 --calibration "$CAL"
x wo4a-kv8 $G quantize "$W/fp32" -o "$W/wo4a-kv8" --method weight-only --bits 4 --keep-8bit '*.attn.*' --kv-cache int8 --calibration "$CAL"
x wo4-kv4 $G quantize "$W/fp32" -o "$W/wo4-kv4" --method weight-only --bits 4 --kv-cache int4 --calibration "$CAL"
for prompt in 32 896; do
  for run in 1 2; do
    $G compare "$W/fp32" "$W/wo8" "$W/wo8-kv8" "$W/wo8b16-kv8" "$W/wo4" "$W/wo4-kv8" "$W/wo4a-kv8" "$W/wo4-kv4" --peers llama.cpp \
      --text "$TEXT" --max-tokens "${MAX_TOKENS:-2048}" --prompts 8 --prompt-tokens "$prompt" --new-tokens 128 \
      --threads 2 --device cpu --markdown "$W/compare-$prompt-$run.md" > /dev/null
  done
done
