"""Does a row's output depend on the batch it runs in? For each model dir: 64 prompts generated
greedily as one left-padded batch and one by one; rows whose ids are identical, and the largest
|logit| difference between a row's batched and solo prefill logits (the cause when ids differ).

    python benchmarks/batch_invariance.py DIR... [--prompts 64] [--new 4] [--text samples/eval/persuasion_ch1-7.txt]
"""

from __future__ import annotations

import argparse

import numpy as np

from gptedge.runtime import load
from gptedge.runtime.generation import left_pad, prefill


def last_logits(model, prompts: list[list[int]]) -> np.ndarray:
    """Last-position logits after prefilling `prompts` as one left-padded batch, in one run. (B, V)"""
    ids, mask = left_pad(prompts, model.manifest.pad_id or 0)
    return prefill(model.variant.start(len(prompts), ids.shape[1] + 1), ids, mask, chunk=None).copy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--new", type=int, default=4)
    ap.add_argument("--text", default="samples/eval/persuasion_ch1-7.txt")
    args = ap.parse_args()
    print("| model | method | rows identical (batch vs solo) | max abs logit diff, prefill |")
    print("|---|---|---:|---:|")
    for path in args.models:
        model = load(path, device="cpu")
        text = model.encode(open(args.text, encoding="utf-8").read()) if model.manifest.shape.vocab_size > 1000 \
            else list(range(1000))
        rng = np.random.default_rng(0)  # prompts of 4..40 tokens at random places in the text
        starts = rng.integers(0, len(text) - 64, args.prompts)
        prompts = [text[s:s + int(n)] for s, n in zip(starts, rng.integers(4, 41, args.prompts))]
        batch = model.generate_batch(prompts, max_new_tokens=args.new, greedy=True, ignore_eos=True)
        solo = [model.generate(p, max_new_tokens=args.new, greedy=True, ignore_eos=True) for p in prompts]
        same = sum(a.ids == b.ids for a, b in zip(batch, solo))
        together = last_logits(model, prompts)
        alone = np.concatenate([last_logits(model, [p]) for p in prompts])
        q = model.manifest.quantization
        print(f"| {path} | {q.method if q else model.manifest.precision} | {same} / {len(prompts)} | "
              f"{np.abs(together - alone).max():.3g} |")


if __name__ == "__main__":
    main()
