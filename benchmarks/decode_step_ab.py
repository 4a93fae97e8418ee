"""One decode step of kv_buffer model dirs, timed side by side: raw ONNX Runtime sessions bound once (the cache
buffers, a one-token input at position T, every position before it attended), the dirs' steps interleaved in each
round, medians per round and each dir's speedup over the first (median of the per-round ratios). No Python loop,
sampling or text: the graph alone, as gptedge's sessions run it (ONNX Runtime's GroupQueryAttentionFusion off).

    python benchmarks/decode_step_ab.py DIR_A DIR_B ... [--position 96] [--rounds 12] [--steps 30] [--threads 2]
        [--batch 1] [--alternate 400]

--alternate N: N cycles of one step per dir in turn instead (the order reversed every other cycle, each session's
threads told to stop spinning when its run returns, so none spins into the next dir's step), each dir's speedup the
median of the per-cycle ratios: on a host whose pace moves within a second this reads 1-2 % differences that rounds
of 30 steps do not. Name the first dir twice (A B A B) to see the noise: the first session made read 1-4 % slower
than a second one of the same dir on a Zen 4 (2026-11-28).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gptedge.runtime.graphs.huge_pages import weights_on_huge_pages  # noqa: E402 - after the sys.path line above

NUMPY = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int8)": np.int8,
         "tensor(uint8)": np.uint8}


def bound_step(model_dir: Path, position: int, threads: int, max_len: int, batch: int = 1, head_size: int = 64,
               stop_spinning: bool = False, huge_pages: bool = True):
    """-> (session, binding, arrays kept alive): a decode step of `batch` rows at `position` over a zeroed cache.
    stop_spinning: the session's threads sleep as soon as a run returns (ONNX Runtime's session.force_spinning_stop)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if stop_spinning:
        options.add_session_config_entry("session.force_spinning_stop", "1")
    # weights on huge pages, as gptedge's CPU sessions have them: on 4 KiB pages each session made after the first
    # read up to 15 % faster than the one before it (one dir named four times, Zen 4, 2026-11-28), on huge pages 1-4 %
    with weights_on_huge_pages(huge_pages):
        session = ort.InferenceSession(str(model_dir / "model.onnx"), options, providers=["CPUExecutionProvider"],
                                       disabled_optimizers=["GroupQueryAttentionFusion"])
    binding, kept = session.io_binding(), []
    names = {i.name for i in session.get_inputs()}
    for i in session.get_inputs():
        if i.name.startswith("past_key_values"):  # (1, kv_heads, max_len, width): past and present, one buffer
            width = i.shape[3] if isinstance(i.shape[3], int) else head_size  # GenAI names it kv_cache_dim
            shape = [batch, i.shape[1], max_len, width]
            buf = np.zeros(shape, NUMPY[i.type])
            kept.append(buf)
            binding.bind_cpu_input(i.name, buf)
            binding.bind_output(i.name.replace("past_key_values", "present"), "cpu", 0, buf.dtype, shape,
                                buf.ctypes.data)
    feeds = {"input_ids": np.full((batch, 1), 42, np.int64), "attention_mask": np.ones((batch, position + 1), np.int64),
             "position_ids": np.full((batch, 1), position, np.int64)}
    for name, array in feeds.items():
        if name in names:
            binding.bind_cpu_input(name, array)
            kept.append(array)
    binding.bind_output("logits", "cpu")
    return session, binding, kept


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--position", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1, help="rows in the step (every row at --position, no padding)")
    ap.add_argument("--head-size", type=int, default=64, help="the cache's last dimension where a graph leaves it "
                    "symbolic (GenAI's builder: kv_cache_dim)")
    ap.add_argument("--alternate", type=int, default=0, metavar="CYCLES",
                    help="one step per dir in turn for CYCLES cycles (module docstring) instead of rounds")
    args = ap.parse_args()
    steps = [bound_step(d, args.position, args.threads, max(1024, args.position + 1), args.batch,
                        args.head_size, stop_spinning=args.alternate > 0) for d in args.dirs]
    if args.alternate:
        alternate(args, steps)
        return
    ms: list[list[float]] = [[] for _ in args.dirs]
    for _ in range(args.rounds):
        for k, (session, binding, _) in enumerate(steps):
            for _ in range(5):
                session.run_with_iobinding(binding)
            times = []
            for _ in range(args.steps):
                start = time.perf_counter()
                session.run_with_iobinding(binding)
                times.append(time.perf_counter() - start)
            ms[k].append(float(np.median(times)) * 1e3)
    print(f"decode step at position {args.position}, batch {args.batch}, {args.threads} threads, "
          f"{args.rounds} rounds x {args.steps} steps")
    print("| dir | median ms per round (min-max) | speedup over the first (median of rounds) |\n|---|---|---:|")
    for d, row in zip(args.dirs, ms, strict=True):
        ratio = float(np.median([a / b for a, b in zip(ms[0], row, strict=True)]))
        print(f"| {d} | {np.median(row):.2f} ({min(row):.2f}-{max(row):.2f}) | {ratio:.3f}x |")


def alternate(args, steps) -> None:
    for session, binding, _ in steps:
        for _ in range(10):
            session.run_with_iobinding(binding)
    ms = np.zeros((args.alternate, len(steps)))
    for c in range(args.alternate):
        for k in range(len(steps))[::1 if c % 2 == 0 else -1]:
            session, binding, _ = steps[k]
            start = time.perf_counter()
            session.run_with_iobinding(binding)
            ms[c, k] = (time.perf_counter() - start) * 1e3
    print(f"decode step at position {args.position}, batch {args.batch}, {args.threads} threads, {args.alternate} "
          "cycles of one step per dir in turn")
    print("| dir | median ms (p10-p90) | speedup over the first (median of per-cycle ratios) |\n|---|---|---:|")
    for k, d in enumerate(args.dirs):
        p10, p90 = np.percentile(ms[:, k], [10, 90])
        print(f"| {d} | {np.median(ms[:, k]):.2f} ({p10:.2f}-{p90:.2f}) | {np.median(ms[:, 0] / ms[:, k]):.3f}x |")


if __name__ == "__main__":
    main()
