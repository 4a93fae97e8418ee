#!/usr/bin/env bash
# One GPU lease's checks in one go (issue "CUDA III"): install onnxruntime-gpu (and onnxruntime-genai-cuda) from
# wheels carried in parts, run the CUDA tests, then the GPU benchmark with and without CUDA graphs.
#
# The GPU machine reaches no registry and each call carries at most 64 MiB with the working tree, so on the machine
# that has pip (x86-64, Python 3.12 wheels):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
#       onnxruntime-gpu==1.31.1 onnxruntime-genai-cuda==0.18.0 -d wheels
#   unzip the onnxruntime-gpu wheel into x/ (drop capi/libonnxruntime_providers_tensorrt.so), add the sample model's
#   model.safetensors, `tar -c . | xz -9e` it (228 MB; the older route: zstd -19 then a Debian zstd binary carried in
#   .gpbin, since the GPU image has no zstd), `split -n 4 -d` into parts .gp1 ... .gp4 (one folder
#   each, git-ignored), carry one folder per call in quick succession, each call copying its part to /tmp/parts (the
#   repo copy drops ignored folders a call does not carry), then run this carrying .gpgenai (the GenAI wheel).
#   The sample model's weights travel as a part because the repo's own 68 MB of safetensors would fill every call:
#   take the three out of the index for the lease (git rm --cached + .git/info/exclude; commit by path meanwhile) and
#   put them back after. The tree without them is ~7.3 MB, so a part may be at most ~56 MiB (55.3 MiB in 2026-11-26).
#
#   bash benchmarks/run_gpu_lease.sh OUT_DIR [BATCHES]
#   env: TESTS / TESTS_K (which CUDA tests), ENGINES (empty: no benchmark), SIZES (small,xl), TARGETS (gptedge's
#   dirs: fp16,int8 weight-only), REPEAT, BENCH_TIMEOUT, SERVE_CLIENTS / SERVE_REQUESTS / SERVE_PROCS (the serve
#   load; its clients over SERVE_PROCS processes; SERVE_TRACE=1: the tree's server traced, engine_trace.py's summary
#   printed and $OUT/trace.PID.jsonl kept), SERVE_ARGS / SERVE_ALSO (serve options for the tree's load / for a
#   second load of it), PROFILE (py-spy of the tree's server under 64 clients: $OUT/profile-*.txt), SERVE_BEFORE (a folder holding an older gptedge/ and runtime/:
#   its server takes the same load first, for a side-by-side)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/gpu-out}; BATCHES=${2:-1,8,64}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
T0=$(date +%s)
say() { echo "[$(($(date +%s) - T0))s] $*"; }
if [ ! -d /tmp/ortgpu/onnxruntime ]; then
  say "assembling onnxruntime-gpu"
  mkdir -p /tmp/ortgpu
  if [ "$(head -c 6 ${PARTS:-/tmp/parts}/part-00 | od -An -tx1 | tr -d ' ')" = "fd377a585a00" ]; then
    # one xz-compressed tar (no binary to carry: Python's tarfile reads xz)
    cat ${PARTS:-/tmp/parts}/part-* | python3 -c "import sys, tarfile; tarfile.open(fileobj=sys.stdin.buffer, \
mode='r|xz').extractall('/tmp/ortgpu', filter='tar')" || exit 1
  else  # a tar holding ort.tar.zst and the weights
    cat ${PARTS:-/tmp/parts}/part-* | tar -x -C /tmp/ortgpu || exit 1
    ZSTD=$(command -v zstd || echo .gpbin/zstd)  # the GPU image has no zstd: a Debian x86-64 binary in .gpbin
    LD_LIBRARY_PATH=.gpbin "$ZSTD" -d -q -c /tmp/ortgpu/ort.tar.zst | tar -x -C /tmp/ortgpu || exit 1
    rm -f /tmp/ortgpu/ort.tar.zst
  fi
fi
[ -f samples/sample-model/model.safetensors ] || cp /tmp/ortgpu/model.safetensors samples/sample-model/model.safetensors
if ls .gpbin/whl/*.whl >/dev/null 2>&1 && [ ! -d /tmp/genai/starlette ]; then  # serve's extra, for SERVE_CLIENTS
  python3 -m pip install -q --no-deps --no-index --target /tmp/genai .gpbin/whl/*.whl
fi
if ls .gpgenai/*.whl >/dev/null 2>&1 && [ ! -d /tmp/genai/onnxruntime_genai ]; then
  python3 -m pip install -q --no-deps --no-index --target /tmp/genai .gpgenai/*.whl
fi
export PYTHONPATH=/tmp/ortgpu:/tmp/genai PATH=/tmp/genai/bin:$PATH  # bin: py-spy from the carried wheel
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || say "editable install failed"
say "versions"
python3 - <<'PY'
import onnxruntime as o
o.preload_dlls()
print("onnxruntime", o.__version__, o.get_available_providers())
try:
    import onnxruntime_genai as g
    print("onnxruntime-genai", g.__version__)
except Exception as e:
    print("genai:", e)
PY
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
say "CUDA tests"
timeout 300 python3 -m pytest -q -m cuda ${TESTS:-tests/cuda/test_cuda.py tests/cuda/test_cuda_families.py} -p no:cacheprovider -s \
  ${TESTS_K:+-k "$TESTS_K"} 2>&1 | grep -v '^$' | tail -60 | tee "$OUT/tests.txt"
if [ -n "${ENGINES-x}" ]; then
  say "benchmark"
  timeout "${BENCH_TIMEOUT:-420}" python3 benchmarks/gpu_bench.py --work /tmp/gpu-bench --sizes "${SIZES:-small}" \
    --batches "$BATCHES" --engines "${ENGINES:-gptedge,gptedge-eager,genai}" --repeat "${REPEAT:-3}" \
    --targets "${TARGETS:-fp16,int8 weight-only}" --out "$OUT/gpu.jsonl" 2>&1 | tail -40
fi
if [ -n "${SERVE_CLIENTS:-}" ]; then  # `gptedge serve --device cuda` under C streaming clients (serve_load.py)
  [ -d /tmp/gpu-bench/small-fp16 ] || python3 benchmarks/gpu_bench.py --work /tmp/gpu-bench --sizes small \
    --batches 1 --engines gptedge --repeat 1 --out "$OUT/gpu-prepare.jsonl" >/dev/null 2>&1
  LOAD="benchmarks/serve_load.py /tmp/gpu-bench/small-fp16 --device cuda --clients $SERVE_CLIENTS
    --requests ${SERVE_REQUESTS:-2} --max-batch 64 --client-procs ${SERVE_PROCS:-1}"
  if [ -n "${SERVE_BEFORE:-}" ]; then  # an older tree's server under the same load first (its gptedge on the path)
    say "serve load, $SERVE_BEFORE"
    (cd "$SERVE_BEFORE" && timeout 300 python3 "$OLDPWD"/$LOAD 2>&1 | tail -30 | tee "$OUT/serve-before.txt")
  fi
  say "serve load"
  SHOWN=30; [ -n "${SERVE_TRACE:-}" ] && SHOWN=60  # the trace's summary too
  timeout 300 python3 $LOAD ${SERVE_ARGS:+--serve-args="$SERVE_ARGS"} ${SERVE_TRACE:+--trace "$OUT/trace"} 2>&1 \
    | tail -$SHOWN | tee "$OUT/serve.txt"
  if [ -n "${SERVE_ALSO:-}" ]; then  # the tree's server once more with other serve options (an A/B in one call)
    say "serve load, $SERVE_ALSO"
    timeout 300 python3 $LOAD --serve-args="$SERVE_ALSO" 2>&1 | tail -30 | tee "$OUT/serve-also.txt"
  fi
  if [ -n "${PROFILE:-}" ] && command -v py-spy >/dev/null; then  # where the server's threads spend 64 clients' time
    say "profile"
    timeout 200 python3 ${LOAD/--clients $SERVE_CLIENTS/--clients 64} --requests 24 >/dev/null 2>&1 &
    for _ in $(seq 60); do PID=$(pgrep -f "gptedge.cli serve" | head -1); [ -n "$PID" ] && break; sleep 0.5; done
    sleep "${PROFILE_AFTER_S:-12}"  # the server's start, CUDA graph capture and warm-up first
    py-spy record --pid "$PID" -d 5 -r 250 --threads --gil -f raw -o "$OUT/profile-gil.txt" >/dev/null 2>&1
    py-spy record --pid "$PID" -d 5 -r 250 --threads --idle -f raw -o "$OUT/profile-all.txt" >/dev/null 2>&1
    wait
  fi
fi
say "done"
