"""Peak RSS of each model dir in a process of its own, next to its size on disk.

    python benchmarks/rss_per_model.py .cache/bench/fp32-kvb .cache/bench/dynamic-kvb --new 64

Runs `gptedge bench DIR --repeat 1 --json` once per model (a fresh process each, so the peak
is that model's alone) and prints graph + external data size, peak RSS and their ratio.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from gptedge.measure.compare import graph_size
from gptedge.runtime.modeldir.manifest import read_manifest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    probe = ("import resource, numpy, onnxruntime, tokenizers, gptedge.runtime; "
             "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)")
    bare = subprocess.run([sys.executable, "-c", probe],
                          check=True, capture_output=True, text=True)
    print(f"A bare Python process with onnxruntime, numpy, tokenizers and gptedge.runtime imported peaks at "
          f"{float(bare.stdout):.0f} MiB.\n")
    print("| model | graph + data on disk (MiB) | peak RSS (MiB) | ratio |")
    print("|---|---:|---:|---:|")
    for model in args.models:
        out = subprocess.run([sys.executable, "-m", "gptedge.cli", "bench", str(model), "--new", str(args.new),
                              "--repeat", "1", "--threads", str(args.threads), "--json"],
                             check=True, capture_output=True, text=True)
        rss = json.loads(out.stdout)["rows"][0]["peak_rss_mb"]  # MiB: ru_maxrss in KiB / 1024
        size = graph_size(model, read_manifest(model)) / 2**20
        print(f"| {model.name} | {size:.1f} | {rss:.0f} | {rss / size:.2f}x |")


if __name__ == "__main__":
    main()
