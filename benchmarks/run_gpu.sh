#!/usr/bin/env bash
# The GPU benchmark (issue: CUDA fp16 / IO-bound decoding). Needs a CUDA GPU, onnxruntime-gpu (gptedge[gpu]),
# torch with CUDA and transformers; optimum-onnx and onnxruntime-genai-cuda for those peers (rows whose
# engine is missing record the error and the run goes on). Results: JSON lines, one per row.
#
#   bash benchmarks/run_gpu.sh [OUT.jsonl]      SIZES=small,xl BATCHES=1,8,64 ENGINES=gptedge,genai,...
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-benchmarks/results/gpu-$(date +%F).jsonl}
exec python3 benchmarks/gpu_bench.py --sizes "${SIZES:-small,xl}" --batches "${BATCHES:-1,8,64}" \
  --engines "${ENGINES:-gptedge,genai,optimum,torch,torch-compile}" --work "${WORK:-/tmp/gpu-bench}" --out "$OUT"
