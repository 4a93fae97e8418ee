"""A long run in one process: does memory stay flat? Generates until --tokens tokens (default 20,000)
with a rotating mix of batch 1 and 8, greedy and seeded top-k / top-p sampling, prompts of 8-64
tokens; prints RSS (current and peak, MiB) as it goes and the peak's growth after the first 1,000
tokens (target: within 5 %).

    python benchmarks/soak.py MODEL_DIR [--tokens 20000] [--threads 2]
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np

from gptedge.runtime import SessionConfig, load
from gptedge.runtime.generation.sampling import SamplingParams

MIXES = [(1, SamplingParams(greedy=True)), (8, SamplingParams(top_k=40, temperature=0.8, seed=1)),
         (1, SamplingParams(top_p=0.9, seed=2)), (8, SamplingParams(greedy=True)),
         (1, SamplingParams(top_k=5, seed=3, repetition_penalty=1.2))]


def rss_mib() -> tuple[float, float]:
    """(current, peak) resident set size of this process in MiB."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    current = pages * resource.getpagesize() / 2**20
    return current, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=20_000)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--new", type=int, default=96, help="new tokens per generation")
    args = ap.parse_args()
    model = load(args.model, device="cpu", session=SessionConfig(threads=args.threads))
    vocab = model.manifest.shape.vocab_size
    rng = np.random.default_rng(0)
    done, runs, started = 0, 0, time.perf_counter()
    at_1000 = None
    print("| tokens | generations | RSS MiB | peak RSS MiB |")
    print("|---:|---:|---:|---:|")
    while done < args.tokens:
        batch, sampling = MIXES[runs % len(MIXES)]
        prompts = [rng.integers(0, vocab, int(rng.integers(8, 65))).tolist() for _ in range(batch)]
        out = model.generate_batch(prompts, max_new_tokens=args.new, ignore_eos=True, with_text=True, sampling=sampling)
        done += sum(len(g.ids) for g in out)
        runs += 1
        current, peak = rss_mib()
        if at_1000 is None and done >= 1000:
            at_1000 = peak
        if runs % 10 == 0 or done >= args.tokens:
            print(f"| {done:,} | {runs} | {current:.1f} | {peak:.1f} |")
    _, peak = rss_mib()
    print(f"\n{done:,} tokens in {runs} generations, {time.perf_counter() - started:.0f} s; peak RSS {at_1000:.1f} MiB "
          f"after the first 1,000 tokens, {peak:.1f} MiB at the end: {100 * (peak / at_1000 - 1):+.2f} %")


if __name__ == "__main__":
    main()
