#!/usr/bin/env bash
# Side-by-side CPU run for the graph variants and recipes added since cpu-2026-11-22b: dynamic INT8 with
# per-row activation scales (default) vs per tensor, weight-only 8- and 4-bit, ONNX Runtime GenAI's loop on
# the same dirs, batch 1 and 8; then the serving load (gptedge serve, 1..16 clients).
# GPT-2 small shape (124M, random seeded weights), greedy, 2 threads; run on a quiet machine.
#   bash benchmarks/run_cpu_variants.sh [WORK_DIR]     (default .cache/bench)
set -euo pipefail
cd "$(dirname "$0")/.."
W=${1:-.cache/bench}
G=${GPTEDGE:-gptedge}
PY=${PYTHON:-python}
mkdir -p "$W"
[ -f "$W/ckpt/model.safetensors" ] || $PY benchmarks/make_gpt2_small.py --out "$W/ckpt"
x() { [ -f "$W/$1/gptedge.json" ] || "${@:2}"; }
x v-fp32 $G export "$W/ckpt" -o "$W/v-fp32"
x v-fp32-kvb $G export "$W/ckpt" -o "$W/v-fp32-kvb" --graph kv_buffer
x v-dynamic-kvb $G quantize "$W/v-fp32-kvb" -o "$W/v-dynamic-kvb" --method dynamic
x v-dynamic-pt-kvb $G quantize "$W/v-fp32-kvb" -o "$W/v-dynamic-pt-kvb" --method dynamic --activation-scale per-tensor --full-range
x v-weight-only-kvb $G quantize "$W/v-fp32-kvb" -o "$W/v-weight-only-kvb" --method weight-only
x v-int4-kvb $G quantize "$W/v-fp32-kvb" -o "$W/v-int4-kvb" --method weight-only --bits 4
x v-dynamic $G quantize "$W/v-fp32" -o "$W/v-dynamic" --method dynamic
echo "# $(date -u +%F) $(uname -m), $(nproc) cpus, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs);" \
  "$(grep -qw avx512_vnni /proc/cpuinfo && echo AVX512-VNNI || (grep -qw avx2 /proc/cpuinfo && echo AVX2 only));" \
  "$($PY -c 'import onnxruntime as o, onnxruntime_genai as g, sys; print("python", sys.version.split()[0], "onnxruntime", o.__version__, "onnxruntime-genai", g.__version__)')"
for B in 1 8; do
  echo; echo "## decode, batch $B, prompt 32, new 128"
  $G bench "$W/v-fp32-kvb" "$W/v-dynamic-kvb" "$W/v-dynamic-pt-kvb" "$W/v-weight-only-kvb" "$W/v-int4-kvb" --batch $B --threads 2
  echo; echo "## ONNX Runtime GenAI on the same dirs, batch $B (each line: gptedge, then GenAI, in one process)"
  for M in v-fp32 v-fp32-kvb v-dynamic v-dynamic-kvb v-weight-only-kvb; do
    $G bench "$W/$M" --batch $B --threads 2 --peers genai | tail -2
  done
done
echo; echo "## serving: gptedge serve, C clients streaming (prompt 32, new 128, 2 requests each)"
$PY benchmarks/serve_load.py "$W/v-fp32-kvb" "$W/v-dynamic-kvb" --clients 1,2,4,8,16 --threads 2
