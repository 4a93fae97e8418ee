"""ONNX Runtime GenAI's own C++ generation loop on the very model dir gptedge ran (its genai_config.json):
a `gptedge bench --peers genai` row, and the GPU benchmark's GenAI column (device "cuda")."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from gptedge.measure.bench import BenchRow, peak_rss_mb

from .base import BenchJob, PeerEngine, PlannedRow, timed


def bench_genai(model_dir: Path, prompts, new_tokens: int, threads: int | None, repeat: int,
                device: str = "cpu") -> BenchRow:
    """Same prompt ids; min_length = max_length keeps it going past eos, as gptedge's bench does (ignore_eos).
    device "cuda": GenAI's CUDA provider (onnxruntime-genai-cuda); threads None: GenAI's default."""
    import onnxruntime_genai as og

    t0 = time.perf_counter()
    config = og.Config(str(model_dir))
    if threads:
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {
            "intra_op_num_threads": threads, "inter_op_num_threads": 1}}}}))
    if device == "cuda":
        config.clear_providers()
        config.append_provider("cuda")
    model = og.Model(config)
    load_s = time.perf_counter() - t0
    ids = np.array(prompts, dtype=np.int32)  # (B, P): equal lengths, no padding

    def generate(n: int) -> None:
        params = og.GeneratorParams(model)
        total = ids.shape[1] + n
        params.set_search_options(do_sample=False, max_length=total, min_length=total, batch_size=ids.shape[0])
        generator = og.Generator(model, params)
        generator.append_tokens(ids)
        for _ in range(n):
            generator.generate_next_token()
        generator.get_sequence(0)  # the ids reach the host: the run is over (on a GPU too)

    ttft, rate, runs = timed(generate, new_tokens, len(prompts), repeat)
    return BenchRow(f"ONNX Runtime GenAI ({model_dir.name})", load_s, ttft, rate, peak_rss_mb(),
                    f"onnxruntime-genai {og.__version__}", runs)


def bench_rows(job: BenchJob) -> list[PlannedRow]:
    return [("genai", lambda: bench_genai(job.model_dir, job.prompts, job.new_tokens, job.threads, job.repeat))]


ENGINE = PeerEngine("genai", needs=("onnxruntime_genai",), bench=bench_rows)
