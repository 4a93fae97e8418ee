"""gptedge model dirs vs ONNX Runtime GenAI's builder export, one generation at a time in turn: every engine loaded
once, then --cycles cycles in which each engine runs one generation (the order reversed every other cycle, a pause
between runs so no engine's idle threads spin into the next one's run), and the ratio of each gptedge dir's decode
rate to each GenAI dir's taken per cycle. On a host whose pace drifts within seconds, rounds of whole benchmarks
(genai_builder_bench.py: each cell ~10 s apart) read 0.7-1.36x for one pair in one evening; here the pairs are
under a second apart, and the median of the per-cycle ratios is the figure.

    python benchmarks/genai_alternate.py --gptedge DIR [DIR...] --genai DIR [DIR...] [--batches 1,8]
        [--spans 32+128,896+128] [--cycles 15] [--threads 2]

Both engines' rates are timed the same way: batch x (new - 1) tokens over the time from the first new token to the
last (gptedge's Generation.tokens_per_s; GenAI's generate_next_token loop timed around its first call), greedy,
the same seeded prompt ids, no text. Speed only: random weights are fine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
from genai_builder_bench import cpu_line, engine_arguments, versions, vocab_of  # noqa: E402 - after sys.path
from gptedge.measure.bench import bench_prompts  # noqa: E402
from gptedge.measure.peers.genai import genai_greedy, genai_model  # noqa: E402
from gptedge.runtime import SessionConfig, load  # noqa: E402

PAUSE_S = 0.05  # longer than ONNX Runtime's spin after a run: the next engine starts on idle cores


class GenAIEngine:
    def __init__(self, model_dir: Path, threads: int):
        import onnxruntime_genai as og

        self.og, self.name = og, f"GenAI {model_dir.name}"
        self.model = genai_model(og, model_dir, threads)

    def rate(self, prompts: list[list[int]], new: int) -> float:
        first = genai_greedy(self.og, self.model, np.array(prompts, dtype=np.int32), new)  # (B, P) equal lengths
        return len(prompts) * (new - 1) / (time.perf_counter() - first)


class GptedgeEngine:
    def __init__(self, model_dir: Path, threads: int):
        self.name = f"gptedge {model_dir.name}"
        self.model = load(model_dir, device="cpu", session=SessionConfig(threads=threads))

    def rate(self, prompts: list[list[int]], new: int) -> float:
        out = self.model.generate_batch(prompts, max_new_tokens=new, greedy=True, ignore_eos=True, with_text=False)
        return out[0].tokens_per_s  # every row's tokens after the first, over the time from the first to the last


def run_cell(engines, prompts, new: int, cycles: int) -> list[list[float]]:
    """-> rates[cycle][engine]."""
    for e in engines:
        e.rate(prompts, 4)  # warm-up
    rates = []
    for c in range(cycles):
        order = list(range(len(engines)))[::1 if c % 2 == 0 else -1]
        row = [0.0] * len(engines)
        for k in order:
            time.sleep(PAUSE_S)
            row[k] = engines[k].rate(prompts, new)
        rates.append(row)
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    engine_arguments(ap)
    ap.add_argument("--cycles", type=int, default=15)
    a = ap.parse_args()
    ours = [GptedgeEngine(d, a.threads) for d in a.gptedge]
    theirs = [GenAIEngine(d, a.threads) for d in a.genai]
    engines = ours + theirs
    vocab = vocab_of(a.genai[0])
    print(f"# gptedge vs GenAI's builder export, generations in turn\n\n- CPU: {cpu_line()}\n- {versions()}\n"
          f"- command: `python {' '.join(sys.argv)}`\n- {a.threads} threads, {a.cycles} cycles a cell; decode "
          "tok/s: median (min-max); ratios: median of the per-cycle ratios (min-max)\n")
    names = " | ".join(e.name for e in engines)
    pairs = [(i, len(ours) + j) for i in range(len(ours)) for j in range(len(theirs))]
    pair_names = " | ".join(f"{engines[i].name} / {engines[j].name}" for i, j in pairs)
    print(f"| prompt + new | batch | {names} | {pair_names} |\n|---|---:|" + "---:|" * (len(engines) + len(pairs)))
    for span in a.spans.split(","):
        prompt_len, new = (int(x) for x in span.split("+"))
        for batch in (int(b) for b in a.batches.split(",")):
            rates = run_cell(engines, bench_prompts(vocab, batch, prompt_len), new, a.cycles)
            cols = []
            for k in range(len(engines)):
                r = [row[k] for row in rates]
                cols.append(f"{statistics.median(r):.1f} ({min(r):.1f}-{max(r):.1f})")
            for i, j in pairs:
                q = [row[i] / row[j] for row in rates]
                cols.append(f"**{statistics.median(q):.3f}x** ({min(q):.2f}-{max(q):.2f})")
            print(f"| {prompt_len} + {new} | {batch} | " + " | ".join(cols) + " |", flush=True)


if __name__ == "__main__":
    main()
