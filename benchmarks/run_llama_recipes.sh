#!/usr/bin/env bash
# Every quantization recipe on one Llama-style checkpoint (issue #34's "the trained sample at every recipe with its
# KL"): fp32, dynamic INT8, static INT8, weight-only 8-bit, 4-bit, 4-bit with the int8 KV cache, 4-bit with
# --scale-search mse, 4-bit with --awq; one `gptedge compare` table on held-out text (perplexity, KL, top-1
# agreement: accuracy only, compare's tok/s column is not a measurement). A recipe gptedge refuses on this checkpoint
# is listed with its one-line refusal instead of a row.
#   bash benchmarks/run_llama_recipes.sh CHECKPOINT WORK_DIR [TEXT]     (TEXT: samples/eval/persuasion_ch1-7.txt;
#   MAX_TOKENS=N scores only its first N tokens)
set -euo pipefail
cd "$(dirname "$0")/.."
CK=${1:?checkpoint}
W=${2:?work dir}
TEXT=${3:-samples/eval/persuasion_ch1-7.txt}
CAL=${CAL:-samples/calibration/emma_ch1-4.txt}
G=${GPTEDGE:-.venv/bin/gptedge}
mkdir -p "$W"
[ -f "$W/fp32/gptedge.json" ] || $G export "$CK" -o "$W/fp32" --graph kv_buffer > /dev/null
dirs=("$W/fp32")
: > "$W/refused.txt"
recipe() {  # name, quantize's arguments
  local name=$1; shift
  if [ ! -f "$W/$name/gptedge.json" ] && ! $G quantize "$W/fp32" -o "$W/$name" "$@" > /dev/null 2> "$W/$name.err"; then
    echo "$name: $(tail -n 1 "$W/$name.err")" >> "$W/refused.txt"
    return 0
  fi
  dirs+=("$W/$name")
}
recipe dynamic --method dynamic
recipe static --method static --calibration "$CAL"
recipe wo8 --method weight-only --bits 8
recipe wo4 --method weight-only --bits 4
recipe wo4-kv8 --method weight-only --bits 4 --kv-cache int8 --calibration "$CAL"
recipe wo4-mse --method weight-only --bits 4 --scale-search mse
recipe wo4-awq --method weight-only --bits 4 --awq --calibration "$CAL"
$G compare "${dirs[@]}" --text "$TEXT" ${MAX_TOKENS:+--max-tokens "$MAX_TOKENS"} --prompts 4 --new-tokens 16 \
  --threads 1 --device cpu --markdown "$W/recipes.md" > /dev/null
cat "$W/recipes.md"
if [ -s "$W/refused.txt" ]; then printf '\nrefused:\n'; cat "$W/refused.txt"; fi
