"""gptedge model dirs vs ONNX Runtime GenAI on its own model builder's export of the same checkpoint: decode tok/s
at batch 1 and 8, each context (prompt + new), every engine on the same seeded prompt ids, timed the same way
(`gptedge bench --peers genai`'s timing: first-token time apart, decode tok/s = batch x (new - 1) / rest), the
rows interleaved within each round, --rounds rounds. Run on a quiet machine.

    python benchmarks/genai_builder_bench.py --gptedge DIR [DIR...] --genai DIR [DIR...] \\
        [--batches 1,8] [--spans 32+128,896+128] [--rounds 2] [--threads 2] [--repeat 3] [--out FILE.md]

The GenAI dirs come from its builder (`python -m onnxruntime_genai.models.builder -m CKPT -i CKPT -o OUT
-p int8|int4 -e cpu`; onnxruntime-genai 0.18's builder needs transformers >= 5 and onnx_ir, which gptedge's own
environment does not have: install them into a separate folder with `pip install --target DIR transformers==5.24.0
onnx_ir` and run the builder with PYTHONPATH=DIR). Figures: speed only (random weights are fine).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gptedge.measure.bench import bench_gptedge, bench_prompts  # noqa: E402 - after the sys.path line above
from gptedge.measure.peers.genai import bench_genai  # noqa: E402 - after the sys.path line above


def cpu_line() -> str:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "?")
    flags = next((set(ln.split(":", 1)[1].split()) for ln in info.splitlines() if ln.startswith("flags")), set())
    isa = ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in ("avx2", "avx512f", "avx512_vnni", "amx_tile"))
    return f"{model}; {info.count('processor')} logical CPUs; ISA: {isa}"


def versions() -> str:
    def v(name):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "absent"
    return ", ".join(f"{n} {v(n)}" for n in ("onnxruntime", "onnxruntime-genai", "gptedge"))


def vocab_of(genai_dir: Path) -> int:
    return json.loads((genai_dir / "genai_config.json").read_text())["model"]["vocab_size"]


def engine_arguments(ap: argparse.ArgumentParser) -> None:
    """The dirs, cells and threads this script and genai_alternate.py share."""
    ap.add_argument("--gptedge", nargs="+", type=Path, required=True)
    ap.add_argument("--genai", nargs="+", type=Path, required=True)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--spans", default="32+128,896+128")
    ap.add_argument("--threads", type=int, default=2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    engine_arguments(ap)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    vocab = vocab_of(a.genai[0])
    spans = [tuple(int(x) for x in s.split("+")) for s in a.spans.split(",")]
    batches = [int(b) for b in a.batches.split(",")]
    names = [f"gptedge {d.name}" for d in a.gptedge] + [f"GenAI {d.name}" for d in a.genai]
    cells: dict[tuple[int, int, str], list[float]] = {}
    for rnd in range(a.rounds):
        for prompt_len, new in spans:
            for batch in batches:
                prompts = bench_prompts(vocab, batch, prompt_len)
                for d in a.gptedge:
                    row = bench_gptedge(str(d), prompts, new, a.threads, a.repeat)
                    cells.setdefault((prompt_len, batch, f"gptedge {d.name}"), []).append(row.decode_tok_s)
                for d in a.genai:
                    row = bench_genai(d, prompts, new, a.threads, a.repeat)
                    cells.setdefault((prompt_len, batch, f"GenAI {d.name}"), []).append(row.decode_tok_s)
                print(f"round {rnd + 1}: prompt {prompt_len} + {new}, batch {batch} done", file=sys.stderr)
    lines = [f"# gptedge vs ONNX Runtime GenAI's builder export: decode tok/s ({datetime.date.today()})", "",
             f"- CPU: {cpu_line()}", f"- {versions()}, python {platform.python_version()}",
             f"- command: `python {' '.join(sys.argv)}`",
             f"- {a.threads} threads, median of {a.repeat} per cell, {a.rounds} rounds interleaved "
             "(cells: round 1 / round 2 ...)", "",
             "| prompt + new | batch | " + " | ".join(names) + " |", "|---|---:|" + "---:|" * len(names)]
    for prompt_len, new in spans:
        for batch in batches:
            row = [" / ".join(f"{x:.1f}" for x in cells[(prompt_len, batch, n)]) for n in names]
            lines.append(f"| {prompt_len} + {new} | {batch} | " + " | ".join(row) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.write_text(text)


if __name__ == "__main__":
    main()
