#!/usr/bin/env bash
# The CPU side-by-side run recorded in benchmarks/results/: GPT-2 small shape (124M, random seeded
# weights), greedy, 2 threads, every row in one session of this script on a quiet machine.
# Needs the test extra (transformers, optimum-onnx) and ctranslate2 for the peers.
#   bash benchmarks/run_cpu.sh [WORK_DIR]     (default .cache/bench)
set -euo pipefail
cd "$(dirname "$0")/.."
W=${1:-.cache/bench}
G=${GPTEDGE:-gptedge}
mkdir -p "$W"
[ -f "$W/ckpt/model.safetensors" ] || python benchmarks/make_gpt2_small.py --out "$W/ckpt"
[ -f "$W/fp32/gptedge.json" ] || $G export "$W/ckpt" -o "$W/fp32"
[ -f "$W/fp32-kvb/gptedge.json" ] || $G export "$W/ckpt" -o "$W/fp32-kvb" --graph kv_buffer
q() { [ -f "$W/$2/gptedge.json" ] || $G quantize "$W/$1" -o "$W/$2" "${@:3}"; }
q fp32 dynamic --method dynamic
q fp32-kvb dynamic-kvb --method dynamic
q fp32-kvb weight-only-kvb --method weight-only --accuracy-level 4
q fp32 static --method static --calibration samples/calibration/emma_ch1-4.txt --calibration-sequences 16
echo "# $(date -u +%F) $(uname -m), $(nproc) cpus; $(python -c 'import onnxruntime as o, sys; print("python", sys.version.split()[0], "onnxruntime", o.__version__)')"
echo; echo "## decode, batch 1, prompt 32, new 128"
$G bench "$W/fp32" "$W/fp32-kvb" "$W/dynamic" "$W/dynamic-kvb" "$W/weight-only-kvb" "$W/static" --threads 2 \
  --peers torch,optimum,ctranslate2
echo; echo "## decode at 1024 context (prompt 896, new 128)"
$G bench "$W/fp32" "$W/fp32-kvb" "$W/dynamic-kvb" --context 1024 --threads 2 --peers ctranslate2
echo; echo "## first token, 512-token prompt (new 8)"
$G bench "$W/fp32" "$W/fp32-kvb" "$W/dynamic" "$W/dynamic-kvb" --prompt 512 --new 8 --threads 2 --peers ctranslate2
echo; echo "## batch 8 (prompt 32, new 128)"
$G bench "$W/fp32-kvb" "$W/dynamic-kvb" "$W/static" "$W/weight-only-kvb" --batch 8 --threads 2
echo; echo "## peak RSS, one model per process (prompt 32, new 64)"
M=$W-medium  # GPT-2 medium shape (355M): where the fixed cost of the process weighs less
[ -f "$M/ckpt/model.safetensors" ] || python benchmarks/make_gpt2_small.py --out "$M/ckpt" --size medium
[ -f "$M/fp32-kvb/gptedge.json" ] || $G export "$M/ckpt" -o "$M/fp32-kvb" --graph kv_buffer
[ -f "$M/dynamic-kvb/gptedge.json" ] || $G quantize "$M/fp32-kvb" -o "$M/dynamic-kvb" --method dynamic
python benchmarks/rss_per_model.py "$W/fp32-kvb" "$W/dynamic-kvb" "$W/weight-only-kvb" "$W/static" \
  "$M/fp32-kvb" "$M/dynamic-kvb"
