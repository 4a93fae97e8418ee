#!/usr/bin/env bash
# Recipe search (issue #23 part 2): the weight-only routes' accuracy next to llama.cpp's Q8_0 / Q4_K_M / Q4_0 on
# one checkpoint, one `gptedge compare` table (KL(fp32||q), size, greedy agreement; decode tok/s at 32 + 64 as a
# rough guide only). Run it on checkpoints no recipe was tuned on (samples/train_sample_model.py --texts kjv or
# --texts austen make two; see benchmarks/results/recipe-search-*.md).
#   GPTEDGE_LLAMA_CPP_SOURCE=DIR/llama_cpp_python-0.3.36.tar.gz bash benchmarks/run_recipe_search.sh CHECKPOINT WORK_DIR
# Routes: 8-bit blocks of 32 / 16 and accuracy level 0; 4-bit asymmetric / symmetric, blocks of 32 / 16, a 4-bit
# embedding; the int8 KV cache; 4-bit with one kind of linear (or the first and last blocks) kept at 8 bits (--keep-8bit), to
# measure which tensors are most sensitive; dynamic for reference. WORK_DIR gets the dirs and recipes.md.
set -euo pipefail
cd "$(dirname "$0")/.."
CK=${1:?checkpoint}
W=${2:?work dir}
TEXT=${TEXT:-samples/eval/persuasion_ch1-7.txt}
G=${GPTEDGE:-.venv/bin/gptedge}
mkdir -p "$W"
x() { [ -f "$W/$1/gptedge.json" ] || "${@:2}" > /dev/null; }
x fp32 $G export "$CK" -o "$W/fp32" --graph kv_buffer
q() { local name=$1; shift; x "$name" $G quantize "$W/fp32" -o "$W/$name" --method weight-only "$@"; }
q wo8
q wo8-b16 --block-size 16
q wo8-acc0 --accuracy-level 0
q wo4 --bits 4
q wo4-b16 --bits 4 --block-size 16
q wo4-sym --bits 4 --symmetric
q wo4-emb4 --bits 4 --embedding-bits 4
q wo4-k-qkv --bits 4 --keep-8bit '*.attn.c_attn'
q wo4-k-aproj --bits 4 --keep-8bit '*.attn.c_proj'
q wo4-k-fc --bits 4 --keep-8bit '*.mlp.c_fc'
q wo4-k-mproj --bits 4 --keep-8bit '*.mlp.c_proj'
last=$(( $(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['n_layer'])" "$CK/config.json") - 1 ))
q wo4-k-ends --bits 4 --keep-8bit 'h.0.*' --keep-8bit "h.$last.*"
q wo4-b16-k-mproj --bits 4 --block-size 16 --keep-8bit '*.mlp.c_proj'
# chosen on the sample model from the rows above (KL saved per MB added): attention's linears, and the two ends
q wo4-k-attn --bits 4 --keep-8bit '*.attn.*'
q wo4-k-attn-ends --bits 4 --keep-8bit '*.attn.*' --keep-8bit 'h.0.*' --keep-8bit "h.$last.*"
# the int8 KV cache (scales from the calibration text) on the leading recipes: what the long-context rows run
CAL=${CAL:-samples/calibration/emma_ch1-4.txt}
q wo8-kv8 --kv-cache int8 --calibration "$CAL"
q wo8-b16-kv8 --block-size 16 --kv-cache int8 --calibration "$CAL"
q wo4-kv8 --bits 4 --kv-cache int8 --calibration "$CAL"
q wo4-k-attn-kv8 --bits 4 --keep-8bit '*.attn.*' --kv-cache int8 --calibration "$CAL"
x dyn $G quantize "$W/fp32" -o "$W/dyn" --method dynamic
dirs=(fp32 wo8 wo8-b16 wo8-acc0 wo4 wo4-b16 wo4-sym wo4-emb4 wo4-k-qkv wo4-k-aproj wo4-k-fc wo4-k-mproj wo4-k-ends
      wo4-b16-k-mproj wo4-k-attn wo4-k-attn-ends wo8-kv8 wo8-b16-kv8 wo4-kv8 wo4-k-attn-kv8 dyn)
$G compare "${dirs[@]/#/$W/}" --peers llama.cpp --text "$TEXT" --max-tokens "${MAX_TOKENS:-2048}" --prompts 4 \
  --prompt-tokens 32 --new-tokens 64 --threads 2 --device cpu --markdown "$W/recipes.md" > /dev/null
cat "$W/recipes.md"
