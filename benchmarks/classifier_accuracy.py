"""Held-out accuracy of classifier dirs on a labelled JSONL, and how far each one is from the first (fp32) dir.

    python benchmarks/classifier_accuracy.py --eval samples/eval/austen-novel.jsonl \\
        fp32=out/cls dynamic=out/cls-dynamic weight-only=out/cls-wo8 ...

Each NAME=DIR is a dir `gptedge export --task` wrote or quantize made from one; the first is the reference.
Columns: accuracy (with its binomial standard error), agreement of the best label with the reference's,
mean KL(reference || dir) over the label distribution (nats), the largest |logit| difference, the size of
the dir's files. Examples are {"text": ..., "label": ...} (or any task's fields plus "label").
Figures only, no timings: they hold on any machine with the same CPU ISA and ONNX Runtime.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from gptedge.runtime import load_classifier
from gptedge.runtime.modeldir.tasks import read_jsonl


@dataclass(frozen=True)
class Row:
    name: str
    path: Path
    accuracy: float
    stderr: float
    agreement: float
    kl: float
    max_diff: float
    mb: float
    recipe: str


def dir_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file()) / 1e6


def probabilities(path: Path, examples: list[dict]) -> tuple[np.ndarray, np.ndarray, list[str], str]:
    """-> probabilities (N, L) float64, logits (N, L), the label names, the recipe's label (fp32 when none)."""
    clf = load_classifier(path, device="cpu")
    fields = clf.task.transformation.fields
    results = clf.classify_batch([{k: e[k] for k in fields} for e in examples])
    q = clf.manifest.quantization
    recipe = "fp32" if q is None else q.label + ("" if q.quantize_head else ", head fp32")
    return (np.array([r.probabilities for r in results]), np.array([r.logits for r in results]),
            list(results[0].labels), recipe)


def measure(dirs: list[tuple[str, Path]], examples: list[dict]) -> list[Row]:
    rows, ref = [], None
    for name, path in dirs:
        p, logits, labels, recipe = probabilities(path, examples)
        gold = np.array([labels.index(e["label"]) for e in examples])
        if ref is None:
            ref = (p, logits)
        acc = float((p.argmax(1) == gold).mean())
        kl = float(np.mean(np.sum(ref[0] * (np.log(ref[0] + 1e-300) - np.log(p + 1e-300)), axis=1)))
        rows.append(Row(name, path, acc, math.sqrt(acc * (1 - acc) / len(examples)),
                        float((p.argmax(1) == ref[0].argmax(1)).mean()), kl, float(np.abs(logits - ref[1]).max()),
                        dir_mb(path), recipe))
    return rows


def table(rows: list[Row], n: int) -> str:
    lines = ["| dir | recipe | accuracy | agreement with fp32 | mean KL(fp32 \\|\\| q) | max \\|logit diff\\| | MB |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.name} | {r.recipe} | {r.accuracy:.2%} ± {r.stderr:.1%} | {r.agreement:.2%} "
                     f"({round(r.agreement * n)}/{n}) | {r.kl:.2e} | {r.max_diff:.3f} | {r.mb:.1f} |")
    return "\n".join(lines)


def header(eval_path: Path, n: int) -> str:
    import onnxruntime

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    return (f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {cpu}, {platform.python_version()}, ONNX Runtime "
            f"{onnxruntime.__version__}; {n} held-out examples from {eval_path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+", metavar="NAME=DIR", help="classifier dirs; the first is the reference")
    ap.add_argument("--eval", type=Path, required=True, help="labelled JSONL: the task's fields plus \"label\"")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    dirs = []
    for spec in args.dirs:
        name, sep, path = spec.partition("=")
        dirs.append((name, Path(path)) if sep else (Path(spec).name, Path(spec)))
    examples = read_jsonl(args.eval.read_text(encoding="utf-8"), str(args.eval))
    missing = [i for i, e in enumerate(examples, 1) if "label" not in e]
    if missing:
        raise SystemExit(f"{args.eval} line {missing[0]}: no \"label\"")
    rows = measure(dirs, examples)
    print(header(args.eval, len(examples)))
    print(table(rows, len(examples)))
    if args.json:
        args.json.write_text(json.dumps([{**r.__dict__, "path": str(r.path)} for r in rows], indent=1) + "\n")


if __name__ == "__main__":
    main()
