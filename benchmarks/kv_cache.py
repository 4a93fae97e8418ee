"""KV cache storage (issue #23): decode tok/s and accuracy of fp32 / fp16 / int8 / int4 caches, side by side.

MODELS are kv_buffer dirs with the same weights and different `--kv-cache` (quantize --kv-cache ...); the
first is the reference (normally the fp32 cache). Three parts, printed as Markdown:

1. speed: greedy decode tok/s (batch 1) at each PROMPT+NEW, every model loaded once and the models run in
   turn within each repeat (so a busy neighbour slows all of them alike); median of --repeat, and the
   ratio to the first model's median;
2. accuracy over the whole context on real text: windows of `context` tokens, fed one token at a time
   through each cache after a 32-token prefill (teacher forcing), mean KL(ref || model) and top-1
   agreement over every position; greedy agreement: from each window's first 32 tokens, the identical
   leading share of a greedy continuation to the end of the context;
3. bytes of a step at 1,024 positions: the weights (the graph's files) and the cache's keys and values,
   and the cache's share (at the context, if shorter).

    python benchmarks/kv_cache.py DIR_FP32 DIR_FP16 DIR_INT8 DIR_INT4 --text samples/eval/persuasion_ch1-7.txt
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from gptedge.measure.bench import bench_prompts
from gptedge.measure.compare import matching_prefix
from gptedge.runtime import SessionConfig, load
from gptedge.runtime.modeldir.kv_cache import KV_CACHES

PREFILL = 32  # tokens of each accuracy window prefilled in one run; the rest are fed one at a time


def speed(models: dict, spans: list[tuple[int, int]], repeat: int) -> list[str]:
    lines = ["| prompt + new | " + " | ".join(f"{n} tok/s" for n in models) + " | " +
             " | ".join(f"{n} / {next(iter(models))}" for n in list(models)[1:]) + " |",
             "|---|" + "---:|" * (2 * len(models) - 1)]
    vocab = next(iter(models.values())).manifest.shape.vocab_size
    for prompt_len, new in spans:
        prompts = bench_prompts(vocab, 1, prompt_len)
        rates = {n: [] for n in models}
        for m in models.values():  # warm-up: buffers, kernels, page faults of the first long cache
            m.generate_batch(prompts, max_new_tokens=4, greedy=True, ignore_eos=True, with_text=False)
        for _ in range(repeat):
            for name, m in models.items():
                out = m.generate_batch(prompts, max_new_tokens=new, greedy=True, ignore_eos=True, with_text=False)
                rates[name].append(out[0].tokens_per_s)
        med = {n: statistics.median(r) for n, r in rates.items()}
        first = med[next(iter(models))]
        lines.append(f"| {prompt_len} + {new} | " + " | ".join(f"{med[n]:.1f}" for n in models) + " | " +
                     " | ".join(f"{med[n] / first:.2f}x" for n in list(models)[1:]) + " |")
        lines.append("|  runs | " + " | ".join(", ".join(f"{x:.1f}" for x in rates[n]) for n in models) + " |" +
                     " |" * (len(models) - 1))
    return lines


def teacher_forced(model, ids: np.ndarray) -> np.ndarray:
    """ids (L,) -> logits (L - PREFILL, V) float32 predicting ids[PREFILL:], through the model's cache."""
    state = model.variant.start(1, len(ids))
    out = [state.run(ids[None, :PREFILL], np.ones((1, PREFILL), np.int64), np.arange(PREFILL)[None])[:, None].copy()]
    for t in range(PREFILL, len(ids) - 1):
        out.append(state.run(ids[None, t:t + 1], np.ones((1, t + 1), np.int64), np.array([[t]]))[:, None].copy())
    return np.concatenate(out, axis=1)[0]


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64) - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def accuracy(models: dict, text_ids: list[int], windows: int) -> list[str]:
    ref_name, ref = next(iter(models.items()))
    context = ref.manifest.shape.context_length
    starts = np.linspace(0, len(text_ids) - context, windows).astype(int)
    chunks = [np.asarray(text_ids[s:s + context], np.int64) for s in starts]
    ref_logits = [log_softmax(teacher_forced(ref, c)) for c in chunks]
    new = context - PREFILL
    ref_greedy = [ref.generate(c[:PREFILL].tolist(), max_new_tokens=new, greedy=True, ignore_eos=True,
                               with_text=False).ids for c in chunks]
    lines = [f"{windows} windows of {context} tokens; KL and top-1 over {windows * (context - PREFILL)} positions "
             f"(teacher forced after a {PREFILL}-token prefill), greedy over {windows} x {new} new tokens",
             "", f"| cache | KL({ref_name} ‖ cache) | top-1 agree | greedy agree (identical prefix) |",
             "|---|---:|---:|---:|"]
    for name, m in list(models.items())[1:]:
        kl, agree, greedy = [], [], []
        for c, lp, rg in zip(chunks, ref_logits, ref_greedy, strict=True):
            lq = log_softmax(teacher_forced(m, c))
            kl.append((np.exp(lp) * (lp - lq)).sum(-1))
            agree.append(lp.argmax(-1) == lq.argmax(-1))
            g = m.generate(c[:PREFILL].tolist(), max_new_tokens=new, greedy=True, ignore_eos=True, with_text=False)
            greedy.append(matching_prefix(rg, g.ids) / len(rg))
        lines.append(f"| {name} | {np.concatenate(kl).mean():.3g} | {100 * np.concatenate(agree).mean():.2f} % | "
                     f"{100 * np.mean(greedy):.1f} % |")
    return lines


def step_bytes(models: dict) -> list[str]:
    """A decode step reads every weight once (the graph's files: the tied embedding is the LM head) and every
    cached key and value; at 1,024 positions, or the model's context if shorter."""
    positions = min(1024, next(iter(models.values())).manifest.shape.context_length)
    lines = [f"| cache | weights MB | KV MB at {positions} positions | KV share of the step's bytes |",
             "|---|---:|---:|---:|"]
    for name, m in models.items():
        s = m.manifest.shape
        weights = sum(r.size for r in m.manifest.files if r.path.startswith("model.onnx"))
        kv = KV_CACHES[m.manifest.kv_cache].bytes_per_position(s.n_layer, s.kv_heads, s.head_dim) * positions
        lines.append(f"| {name} | {weights / 1e6:.1f} | {kv / 1e6:.1f} | {100 * kv / (kv + weights):.1f} % |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--spans", default="32+128,896+128", help="PROMPT+NEW, comma separated (cut to the context)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--text", type=Path, help="real text for the accuracy part (skipped without)")
    ap.add_argument("--windows", type=int, default=2, help="accuracy windows of the whole context")
    ap.add_argument("--skip-speed", action="store_true")
    args = ap.parse_args()
    models = {}
    for d in args.models:
        m = load(d, device="cpu", session=SessionConfig(threads=args.threads))
        models[f"{m.manifest.kv_cache}"] = m
    context = next(iter(models.values())).manifest.shape.context_length
    spans = []
    for span in args.spans.split(","):
        p, n = map(int, span.split("+"))
        spans.append((min(p, context - n), n))
    started = time.perf_counter()
    print(f"models: {', '.join(f'{k} = {d}' for k, d in zip(models, args.models, strict=True))}; {args.threads} "
          "threads\n")
    if not args.skip_speed:
        print("\n".join(speed(models, spans, args.repeat)) + "\n")
    if args.text:
        ids = next(iter(models.values())).encode(args.text.read_text(encoding="utf-8"))
        print("\n".join(accuracy(models, ids, args.windows)) + "\n")
    print("\n".join(step_bytes(models)))
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
