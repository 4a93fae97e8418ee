"""Does a row's output depend on the batch it runs in? For each model dir: 64 prompts generated greedily as one
left-padded batch and one by one (rows whose ids are identical), the largest |logit| difference between a row's
batched and solo prefill logits (the cause when ids differ), and the same two figures for a batch whose prompts
all have one length (no padding: every recipe's rows are then computed exactly as alone, difference 0).

    python benchmarks/batch_invariance.py DIR... [--prompts 64] [--new 4] [--text samples/eval/persuasion_ch1-7.txt]

The last column is the serving engine's: the same prompts submitted to Engine(max_batch=8), which prefills each
request alone and decodes up to 8 together (rows identical with generate() alone).

Results are not timings: they hold on any quiet or busy machine with the same CPU ISA and ONNX Runtime (the
kernels' float summation order is what differs between ISAs). The header prints both.
"""

from __future__ import annotations

import argparse
import platform
from datetime import datetime, timezone

import numpy as np

from gptedge.runtime import load
from gptedge.runtime.generation.generation import left_pad, prefill
from gptedge.runtime.generation.sampling import SamplingParams
from gptedge.runtime.serving.engine import CompletionRequest, Engine


def last_logits(model, prompts: list[list[int]]) -> np.ndarray:
    """Last-position logits after prefilling `prompts` as one left-padded batch, in one run. (B, V)"""
    ids, mask = left_pad(prompts, model.manifest.pad_id or 0)
    return prefill(model.variant.start(len(prompts), ids.shape[1] + 1), ids, mask, chunk=None).copy()


def invariance(model, prompts: list[list[int]], new: int) -> tuple[int, float]:
    """-> (rows whose greedy ids match generate() alone, max |logit diff| of batched vs solo prefill)."""
    batch = model.generate_batch(prompts, max_new_tokens=new, greedy=True, ignore_eos=True)
    solo = [model.generate(p, max_new_tokens=new, greedy=True, ignore_eos=True) for p in prompts]
    together = last_logits(model, prompts)
    alone = np.concatenate([last_logits(model, [p]) for p in prompts])
    return sum(a.ids == b.ids for a, b in zip(batch, solo, strict=True)), float(np.abs(together - alone).max())


def engine_invariance(model, prompts: list[list[int]], new: int) -> int:
    """Rows whose greedy ids from the serving engine (8 rows at a time) match generate() alone."""
    engine = Engine(model, max_batch=8, max_queue=len(prompts)).start()
    done: dict[int, list[int]] = {}

    def collect(i):
        return lambda event: done.__setitem__(i, event.generation.ids) if event.finish_reason else None

    for i, p in enumerate(prompts):
        engine.submit(CompletionRequest(tuple(p), new, SamplingParams(greedy=True), ignore_eos=True), collect(i))
    engine.stop(grace_s=600)  # lets every request finish, then joins
    solo = [model.generate(p, max_new_tokens=new, greedy=True, ignore_eos=True).ids for p in prompts]
    return sum(done.get(i) == ids for i, ids in enumerate(solo))


def isa() -> str:
    flags = next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags")), [])
    return ", ".join(f for f in ("avx2", "avx512f", "avx512_vnni", "amx_int8") if f in flags) or "unknown"


def main() -> None:
    import onnxruntime

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--new", type=int, default=4)
    ap.add_argument("--text", default="samples/eval/persuasion_ch1-7.txt")
    args = ap.parse_args()
    print(f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.machine()} ({isa()}), "
          f"onnxruntime {onnxruntime.__version__}, {args.prompts} prompts, {args.new} new tokens, greedy")
    print("| model | method | rows identical, 4-40 tokens (left-padded) | max abs logit diff, prefill | "
          "rows identical, one length | max abs logit diff, one length | rows identical, serving engine |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for path in args.models:
        model = load(path, device="cpu")
        text = model.encode(open(args.text, encoding="utf-8").read()) if model.manifest.shape.vocab_size > 1000 \
            else list(range(1000))
        rng = np.random.default_rng(0)  # prompts of 4..40 tokens at random places in the text
        starts = rng.integers(0, len(text) - 64, args.prompts)
        prompts = [text[s:s + int(n)] for s, n in zip(starts, rng.integers(4, 41, args.prompts), strict=True)]
        same, diff = invariance(model, prompts, args.new)
        same_eq, diff_eq = invariance(model, [text[s:s + 20] for s in starts], args.new)
        served = engine_invariance(model, prompts, args.new)
        q = model.manifest.quantization
        method = f"{q.label if q else model.manifest.precision} {model.manifest.graph}"
        print(f"| {path} | {method} | {same} / {len(prompts)} | {diff:.3g} | {same_eq} / {len(prompts)} | "
              f"{diff_eq:.3g} | {served} / {len(prompts)} |")


if __name__ == "__main__":
    main()
