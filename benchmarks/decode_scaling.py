"""How a continuous batch's decode step scales with its rows: the server's own pool, no HTTP.

    python benchmarks/decode_scaling.py .cache/bench/wo8-kvb .cache/bench/dynamic-kvb [--rows 1,2,4,8,12,16]
        [--prompt 32] [--steps 32] [--threads 2] [--no-spin]

Per model, a sequence pool of max(rows) (what `gptedge serve --max-batch` makes) is filled with `rows`
sequences of --prompt seeded random tokens each, then --steps decode steps are timed; printed per row
count: ms per step, aggregate tok/s, the speedup over one row, and the time of the rows' prefill (one group
run of rows x prompt positions, the first of its shape: a cold run). A step whose cost grows as fast as its
rows gains nothing from batching: the kernel runs the rows one by one. --no-spin turns ONNX Runtime's
intra-op spin-waiting off (the server's threads then yield the cores between runs).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import time



def cpu_line() -> str:
    info = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    isa = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8") if f in flags]
    return f"{name} ({', '.join(isa) or 'no AVX2'}), {os.cpu_count()} cpus"


def step_times(model_dir: str, rows: list[int], prompt: int, steps: int, threads: int,
               spin: bool) -> dict[int, tuple[float, float]]:
    """{rows: (seconds of the group prefill of rows x prompt, seconds per decode step)}"""
    from gptedge.measure.bench import bench_prompts
    from gptedge.runtime import SessionConfig, load
    from gptedge.runtime.graphs.sequence_pool import pool_for

    config = SessionConfig(threads=threads, spin=spin)
    model = load(model_dir, device="cpu", session=config)
    vocab = model.manifest.shape.vocab_size
    out = {}
    for n in rows:
        pool = pool_for(model.variant, max(rows), model.manifest.shape.context_length)
        prompts = bench_prompts(vocab, n, prompt)
        started = time.perf_counter()
        logits = pool.prefill_group(list(range(n)), prompts)  # (n, V)
        prefill_s = time.perf_counter() - started
        tokens = logits.argmax(-1)
        tokens = pool.step(list(range(n)), tokens).argmax(-1)  # warm-up: this row count's first step
        started = time.perf_counter()
        for _ in range(steps):
            tokens = pool.step(list(range(n)), tokens).argmax(-1)
        out[n] = prefill_s, (time.perf_counter() - started) / steps
        del pool
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--rows", default="1,2,4,8,12,16")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-spin", action="store_true")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    import onnxruntime

    print(f"decode_scaling {datetime.date.today()}: {cpu_line()}; python {platform.python_version()}, onnxruntime "
          f"{onnxruntime.__version__}; prompt {args.prompt}, {args.steps} steps, {args.threads} threads, "
          f"spin {'off' if args.no_spin else 'on'}")
    for model_dir in args.models:
        times = step_times(model_dir, rows, args.prompt, args.steps, args.threads, not args.no_spin)
        print(f"\n{model_dir}\n| rows | ms / step | tok/s | x one row | prefill of rows x prompt ms |\n"
              "|---:|---:|---:|---:|---:|")
        one = rows[0] / times[rows[0]][1]
        for n, (prefill_s, s) in times.items():
            print(f"| {n} | {s * 1000:.1f} | {n / s:.1f} | {n / s / one:.2f} | {prefill_s * 1000:.0f} |")


if __name__ == "__main__":
    main()
