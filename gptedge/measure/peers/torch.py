"""transformers' PyTorch eager generate, fp32, on the checkpoint: a `gptedge bench --peers torch` row."""

from __future__ import annotations

import time
from pathlib import Path

from gptedge.measure.bench import BenchRow, peak_rss_mb

from .base import BenchJob, PeerEngine, PlannedRow, timed


def bench_torch(source: Path, prompts, new_tokens: int, threads: int, repeat: int) -> BenchRow:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(source, torch_dtype=torch.float32).eval()
    load_s = time.perf_counter() - t0
    ids = torch.tensor(prompts)

    def generate(n: int) -> None:
        with torch.inference_mode():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, pad_token_id=0)

    ttft, rate, runs = timed(generate, new_tokens, len(prompts), repeat)
    return BenchRow("transformers (PyTorch eager) fp32", load_s, ttft, rate, peak_rss_mb(),
                    f"torch {torch.__version__}", runs)


def bench_rows(job: BenchJob) -> list[PlannedRow]:
    return [("transformers", lambda: bench_torch(job.source, job.prompts, job.new_tokens, job.threads, job.repeat))]


ENGINE = PeerEngine("torch", needs=("torch", "transformers"), bench=bench_rows)
