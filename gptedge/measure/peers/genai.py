"""ONNX Runtime GenAI's own C++ generation loop on the very model dir gptedge ran (its genai_config.json):
a `gptedge bench --peers genai` row, and the GPU benchmark's GenAI column (device "cuda")."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from gptedge.measure.bench import BenchRow, peak_rss_mb

from .base import BenchJob, PeerEngine, PlannedRow, timed


def genai_model(og, model_dir: Path, threads: int | None, device: str = "cpu"):
    """GenAI's model of a dir (its genai_config.json), on `threads` intra-op threads (None: GenAI's default); device
    "cuda": GenAI's CUDA provider (onnxruntime-genai-cuda)."""
    config = og.Config(str(model_dir))
    if threads:
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {
            "intra_op_num_threads": threads, "inter_op_num_threads": 1}}}}))
    if device == "cuda":
        config.clear_providers()
        config.append_provider("cuda")
    return og.Model(config)


def genai_greedy(og, model, ids: np.ndarray, n: int) -> float:
    """n greedy tokens after each row of ids (B, P) int32, equal lengths: min_length = max_length keeps it going past
    eos, as gptedge's bench does (ignore_eos) -> perf_counter() when the first new token was out."""
    params = og.GeneratorParams(model)
    total = ids.shape[1] + n
    params.set_search_options(do_sample=False, max_length=total, min_length=total, batch_size=ids.shape[0])
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    generator.generate_next_token()
    first = time.perf_counter()
    for _ in range(n - 1):
        generator.generate_next_token()
    generator.get_sequence(0)  # the ids reach the host: the run is over (on a GPU too)
    return first


def bench_genai(model_dir: Path, prompts, new_tokens: int, threads: int | None, repeat: int,
                device: str = "cpu") -> BenchRow:
    """Same prompt ids as gptedge's rows; threads None: GenAI's default."""
    import onnxruntime_genai as og

    t0 = time.perf_counter()
    model = genai_model(og, model_dir, threads, device)
    load_s = time.perf_counter() - t0
    ids = np.array(prompts, dtype=np.int32)  # (B, P): equal lengths, no padding
    ttft, rate, runs = timed(lambda n: genai_greedy(og, model, ids, n), new_tokens, len(prompts), repeat)
    return BenchRow(f"ONNX Runtime GenAI ({model_dir.name})", load_s, ttft, rate, peak_rss_mb(),
                    f"onnxruntime-genai {og.__version__}", runs)


def bench_rows(job: BenchJob) -> list[PlannedRow]:
    return [("genai", lambda: bench_genai(job.model_dir, job.prompts, job.new_tokens, job.threads, job.repeat))]


ENGINE = PeerEngine("genai", needs=("onnxruntime_genai",), bench=bench_rows)
