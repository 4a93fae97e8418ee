"""Where decode time goes: ONNX Runtime's per-op profiler over a greedy run, summed by op type.

    python benchmarks/profile_ops.py .cache/gpt2-small-fp32 --threads 2 --prompt 32 --new 64
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile

from gptedge.measure.bench import bench_prompts
from gptedge.runtime import SessionConfig, load
from gptedge.runtime.generation.generation_options import PREFILL_CHUNK


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prefill-chunk", type=int, default=PREFILL_CHUNK, help="0: the whole prompt in one run")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = SessionConfig(threads=args.threads, profile_prefix=os.path.join(tmp, "profile"))
        model = load(args.model, device="cpu", session=config)
        chunk = model.variant.prefill_chunk(args.batch, args.prefill_chunk or None)
        prefill_runs = -(-args.prompt // chunk) if chunk else 1
        prompt = bench_prompts(model.manifest.shape.vocab_size, args.batch, args.prompt)
        out = model.generate_batch(prompt, max_new_tokens=args.new, greedy=True, ignore_eos=True, with_text=False,
                                   prefill_chunk=chunk)[0]
        with open(model.session.end_profiling()) as f:
            events = json.load(f)
    # the first run is load()'s one-token check of the manifest against the graph
    model_runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])[1:]
    events = [e for e in events if e["ts"] >= model_runs[0]["ts"]]
    last_prefill = model_runs[prefill_runs - 1]
    prefill_end = last_prefill["ts"] + last_prefill["dur"]  # the first runs are the prompt's prefill
    print(f"{args.model}: prompt {args.prompt} x batch {args.batch}, {args.new} new tokens at "
          f"{out.tokens_per_s:.1f} tok/s (profiling on), {args.threads} threads")
    for label, runs, in_phase in (
            (f"prefill ({prefill_runs} runs)", model_runs[:prefill_runs], lambda e: e["ts"] < prefill_end),
            (f"decode ({len(model_runs) - prefill_runs} runs)", model_runs[prefill_runs:],
             lambda e: e["ts"] >= prefill_end)):
        _print_table(label, runs, [e for e in events if in_phase(e)], args.top)


def _print_table(label: str, runs: list[dict], events: list[dict], top: int) -> None:
    by_op: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            by_op[e["args"]["op_name"]] += e["dur"]
            calls[e["args"]["op_name"]] += 1
    run_us = sum(e["dur"] for e in runs)
    kernels = sum(by_op.values())
    print(f"\n{label}: model_run {run_us / 1000:.1f} ms, of which kernels {kernels / 1000:.1f} ms "
          f"({100 * kernels / max(run_us, 1):.0f} %); the rest is ONNX Runtime's own per-run overhead")
    print("| op | ms | % of kernel time | calls |")
    print("|---|---:|---:|---:|")
    for op, dur in by_op.most_common(top):
        print(f"| {op} | {dur / 1000:.1f} | {100 * dur / max(kernels, 1):.1f} | {calls[op]} |")

if __name__ == "__main__":
    main()
