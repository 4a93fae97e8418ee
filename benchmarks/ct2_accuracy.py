"""CTranslate2's accuracy on the same text and windows as `gptedge compare`, against gptedge's fp32.

The accuracy target (docs/performance.md#targets) compares gptedge's most faithful INT8 with CTranslate2 int8 of the
same model: this prints CTranslate2's perplexity, top-1 agreement and mean KL(fp32 || ct2) in the same
terms as compare's table (the fp32 reference is the gptedge fp32 export of the same checkpoint).

    python benchmarks/ct2_accuracy.py samples/sample-model out/demo/fp32 --text samples/eval/persuasion_ch1-7.txt
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

import ctranslate2
import numpy as np

from gptedge.runtime import load
from gptedge.runtime.generation.evaluate import log_softmax, sliding_windows, window_logits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", type=Path, help="HF checkpoint dir (config.json, weights, tokenizer.json)")
    ap.add_argument("fp32", type=Path, help="gptedge fp32 export of the same checkpoint")
    ap.add_argument("--text", type=Path, required=True)
    ap.add_argument("--max-tokens", type=int, default=None)
    args = ap.parse_args()
    ref = load(args.fp32, device="cpu")
    ids = ref.encode(args.text.read_text(encoding="utf-8"))[: args.max_tokens or None]
    tokens = [ref.tokenizer.id_to_token(i) for i in ids]
    windows = sliding_windows(len(ids), ref.manifest.shape.context_length)
    print(f"{args.text} ({len(ids):,} tokens), reference {args.fp32}")
    print("| engine | perplexity | top-1 agree | KL(ref‖model) |")
    print("|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for compute_type in ("float32", "int8"):
            out = Path(tmp) / compute_type
            ctranslate2.converters.TransformersConverter(str(args.checkpoint)).convert(str(out),
                                                                                       quantization=compute_type)
            generator = ctranslate2.Generator(str(out), device="cpu", compute_type=compute_type, intra_threads=2)
            nll = kl = agree = count = 0.0
            for w in windows:
                ref_logits, targets = window_logits(ref, ids, w)
                logits = np.asarray(generator.forward_batch([tokens[w.begin:w.end]]))[0]  # (L, V)
                first = w.first_target - w.begin
                logits = logits[first - 1:-1].astype(np.float32)
                ref_logp, logp = log_softmax(ref_logits), log_softmax(logits)
                rows = np.arange(len(targets))
                nll -= logp[rows, targets].sum()
                kl += (np.exp(ref_logp) * (ref_logp - logp)).sum()
                agree += (logits.argmax(-1) == ref_logits.argmax(-1)).sum()
                count += len(targets)
            print(f"| CTranslate2 {compute_type} | {math.exp(nll / count):.3f} | {100 * agree / count:.2f} % | "
                  f"{kl / count:.3g} |")


if __name__ == "__main__":
    main()
