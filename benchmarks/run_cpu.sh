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
for m in dynamic weight-only; do
  [ -f "$W/$m/gptedge.json" ] || $G quantize "$W/fp32" -o "$W/$m" --method "$m"
done
[ -f "$W/static/gptedge.json" ] || $G quantize "$W/fp32" -o "$W/static" --method static \
  --calibration samples/calibration/emma_ch1-4.txt --calibration-sequences 16
echo "# $(date -u +%F) $(uname -m), $(nproc) cpus; $(python -c 'import onnxruntime as o, sys; print("python", sys.version.split()[0], "onnxruntime", o.__version__)')"
echo; echo "## decode, batch 1, prompt 32, new 128"
$G bench "$W/fp32" "$W/dynamic" "$W/weight-only" "$W/static" --threads 2 --peers torch,optimum,ctranslate2
echo; echo "## decode at 1024 context (prompt 896, new 128)"
$G bench "$W/fp32" "$W/dynamic" --context 1024 --threads 2 --peers ctranslate2
echo; echo "## first token, 512-token prompt (new 8)"
$G bench "$W/fp32" "$W/dynamic" --prompt 512 --new 8 --threads 2 --peers ctranslate2
echo; echo "## batch 8 (prompt 32, new 128)"
$G bench "$W/fp32" "$W/dynamic" --batch 8 --threads 2
