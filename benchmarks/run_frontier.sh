#!/usr/bin/env bash
# The accuracy x speed frontier: gptedge's recipes next to CTranslate2 (int8), llama.cpp (Q8_0, Q4_K_M, Q4_0)
# and Optimum (dynamic int8), each quantizing the same HF checkpoint its own way, all scored by
# `gptedge compare --peers` on the same windows against the same fp32 export, with decode tok/s from the same
# greedy prompts (8 x 32-token prompts, 128 new tokens, batch 1, 2 threads). Run on a quiet machine.
#   GPTEDGE_LLAMA_CPP_SOURCE=DIR/llama_cpp_python-0.3.36.tar.gz bash benchmarks/run_frontier.sh [CHECKPOINT] [WORK_DIR]
# Defaults: samples/sample-model, out/frontier. Writes WORK_DIR/frontier.md, .json (rows with dominated_by)
# and .png (the KL vs tok/s panel draws the Pareto front). MAX_TOKENS=N scores only the text's first N tokens.
set -euo pipefail
cd "$(dirname "$0")/.."
CK=${1:-samples/sample-model}
W=${2:-out/frontier}
TEXT=${TEXT:-samples/eval/persuasion_ch1-7.txt}
G=${GPTEDGE:-.venv/bin/gptedge}
PY=${PYTHON:-.venv/bin/python}
mkdir -p "$W"
x() { [ -f "$W/$1/gptedge.json" ] || "${@:2}"; }
x fp32 $G export "$CK" -o "$W/fp32"
x fp32-kvb $G export "$CK" -o "$W/fp32-kvb" --graph kv_buffer
x dynamic-kvb $G quantize "$W/fp32-kvb" -o "$W/dynamic-kvb" --method dynamic
x static-kvb $G quantize "$W/fp32-kvb" -o "$W/static-kvb" --method static --calibration samples/calibration/emma_ch1-4.txt
x weight-only-kvb $G quantize "$W/fp32-kvb" -o "$W/weight-only-kvb" --method weight-only
x int4-kvb $G quantize "$W/fp32-kvb" -o "$W/int4-kvb" --method weight-only --bits 4
{
  echo "# $(date -u +%F) $(uname -m), $(nproc) cpus, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs);" \
    "$(grep -qw avx512_vnni /proc/cpuinfo && echo AVX512-VNNI || (grep -qw avx2 /proc/cpuinfo && echo AVX2 only))"
  $PY - <<'EOF'
from importlib.metadata import PackageNotFoundError, version
def v(name):
    try:
        return version(name)
    except PackageNotFoundError:
        return "absent"
print("#", ", ".join(f"{n} {v(n)}" for n in ("onnxruntime", "ctranslate2", "llama_cpp_python", "optimum-onnx", "torch")))
EOF
  echo "# $G compare $W/fp32 <gptedge dirs> --peers ctranslate2,llama.cpp,optimum --text $TEXT --prompts 8 --new-tokens 128 --threads 2"
} > "$W/frontier-setup.txt"
$G compare "$W/fp32" "$W/fp32-kvb" "$W/dynamic-kvb" "$W/static-kvb" "$W/weight-only-kvb" "$W/int4-kvb" \
  --peers ctranslate2,llama.cpp,optimum --text "$TEXT" --prompts 8 --new-tokens 128 --threads 2 --device cpu \
  ${MAX_TOKENS:+--max-tokens "$MAX_TOKENS"} --markdown "$W/frontier.md" --plot "$W/frontier.png" --json > "$W/frontier.json"
cat "$W/frontier-setup.txt" "$W/frontier.md"
