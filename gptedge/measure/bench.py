"""gptedge bench: load time, time to first token, decode tokens/s and peak RSS of one model dir.

Speed is measured, never asserted. All rows of one run use the same seeded prompt ids.
"""

from __future__ import annotations

import resource
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from gptedge.runtime.graphs.session import SessionConfig
from gptedge.runtime.model import load


@dataclass
class BenchRow:
    name: str
    load_s: float
    ttft_s: float  # prefill of the prompt and the first new token
    decode_tok_s: float  # new tokens after the first, over all rows of the batch, per second
    peak_rss_mb: float  # MiB, of the whole process when the row finished (rows run in order)
    notes: str = ""
    runs: list[float] = field(default_factory=list)  # decode tok/s of each repeat

    def to_dict(self) -> dict:
        return asdict(self)


def peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux


def bench_prompts(vocab: int, batch: int, length: int, seed: int = 0) -> list[list[int]]:
    """Seeded random ids: the same for gptedge and every peer."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab, size=(batch, length)).tolist()


def bench_gptedge(model_dir: str, prompts: list[list[int]], new_tokens: int, threads: int | None = None,
                  repeat: int = 3, device: str = "cpu", name: str | None = None, cuda_graph: bool = True) -> BenchRow:
    started = time.perf_counter()
    model = load(model_dir, device=device, session=SessionConfig(threads=threads, cuda_graph=cuda_graph))
    load_s = time.perf_counter() - started
    model.generate_batch(prompts, max_new_tokens=4, greedy=True, ignore_eos=True, with_text=False)  # warm-up
    ttft, rates = [], []
    for _ in range(repeat):
        out = model.generate_batch(prompts, max_new_tokens=new_tokens, greedy=True, ignore_eos=True, with_text=False)
        ttft.append(out[0].time_to_first_token_s)
        rates.append(out[0].tokens_per_s)
    m = model.manifest
    method = m.quantization.method if m.quantization and m.quantization.method != m.precision else ""  # fp16: once
    label = name or f"gptedge {m.precision} {method}".strip()
    return BenchRow(label, load_s, statistics.median(ttft), statistics.median(rates), peak_rss_mb(),
                    notes=", ".join(model.providers + (["CUDA graphs"] if _uses_cuda_graphs(model) else [])),
                    runs=rates)


def _uses_cuda_graphs(model) -> bool:
    graphs = getattr(model.variant, "cuda_graphs", None)
    return graphs is not None and graphs.failed is None
