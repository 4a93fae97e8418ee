"""The margin of quantize --kv-cache int8 / int4 scales (quantize/kv_cache.py MARGIN), swept on one model.

For each margin: the kv_buffer fp32 dir SOURCE requantized with only the cache changed (fp32 weights), then
mean KL(fp32 || cache) and top-1 agreement over --windows windows of the whole context of real text,
teacher forced through the cache (benchmarks/kv_cache.py's accuracy part).

    python benchmarks/kv_cache_margin.py SOURCE --calibration samples/calibration/emma_ch1-4.txt \\
        --text samples/eval/persuasion_ch1-7.txt
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from gptedge.quantize import kv_cache as kv
from gptedge.quantize.quantizer import quantize_model_dir
from gptedge.runtime import load

sys.path.insert(0, str(Path(__file__).parent))
from kv_cache import log_softmax, teacher_forced  # noqa: E402  (the sibling script's helpers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", type=Path)
    ap.add_argument("--calibration", type=Path, required=True)
    ap.add_argument("--text", type=Path, required=True)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--int8", default="0.8,1.0,1.2,1.5")
    ap.add_argument("--int4", default="0.5,0.6,0.7,0.8,0.9,1.0")
    args = ap.parse_args()
    ref = load(args.source, device="cpu")
    context = ref.manifest.shape.context_length
    ids = ref.encode(args.text.read_text(encoding="utf-8"))
    chunks = [np.asarray(ids[s:s + context], np.int64)
              for s in np.linspace(0, len(ids) - context, args.windows).astype(int)]
    ref_lp = [log_softmax(teacher_forced(ref, c)) for c in chunks]
    calibration = args.calibration.read_text(encoding="utf-8")
    print(f"{args.source}: {args.windows} windows of {context} tokens of {args.text.name}\n")
    print("| cache | margin | KL(fp32 ‖ cache) | top-1 agree |\n|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for cache in ("int8", "int4"):
            for margin in map(float, getattr(args, cache).split(",")):
                kv.MARGIN[cache] = margin
                out = Path(tmp) / f"{cache}-{margin}"
                quantize_model_dir(args.source, out, None, calibration_text=calibration, kv_cache=cache)
                m = load(out, device="cpu")
                kl, agree = [], []
                for c, lp in zip(chunks, ref_lp, strict=True):
                    lq = log_softmax(teacher_forced(m, c))
                    kl.append((np.exp(lp) * (lp - lq)).sum(-1))
                    agree.append(lp.argmax(-1) == lq.argmax(-1))
                print(f"| {cache} | {margin} | {np.concatenate(kl).mean():.3g} | "
                      f"{100 * np.concatenate(agree).mean():.2f} % |", flush=True)


if __name__ == "__main__":
    main()
