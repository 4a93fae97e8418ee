"""CTranslate2 on the checkpoint, converted with its own quantization: `bench --peers ctranslate2` times
float32 and int8 (`Generator.generate_batch`); `compare --peers ctranslate2` scores int8 and int8_float32
(`Generator.forward_batch` logits, `Generator.generate_tokens` greedy). On CPU it runs "int8" as
int8_float32: the two recipes are one engine configuration (`resolved`), so compare shows one row."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from gptedge.measure.bench import BenchRow, peak_rss_mb

from .base import BenchJob, Greedy, PeerEngine, PeerInfo, PlannedRow, ScoreJob, timed, timed_greedy


def ctranslate2_model_dir(source: Path, quantization: str, work: Path) -> Path:
    """CTranslate2's conversion of the checkpoint with its own quantization, under `work` (once)."""
    import ctranslate2

    out = work / f"ct2-{quantization}"
    if not out.exists():
        ctranslate2.converters.TransformersConverter(str(source)).convert(str(out), quantization=quantization)
    return out


def bench_ctranslate2(source: Path, prompts, new_tokens: int, threads: int, repeat: int, compute_type: str,
                      work: Path) -> BenchRow:
    import ctranslate2
    from transformers import AutoTokenizer

    out = ctranslate2_model_dir(source, compute_type, work)
    t0 = time.perf_counter()
    generator = ctranslate2.Generator(str(out), device="cpu", compute_type=compute_type, intra_threads=threads)
    load_s = time.perf_counter() - t0
    tokenizer = AutoTokenizer.from_pretrained(source)
    tokens = [tokenizer.convert_ids_to_tokens(p) for p in prompts]

    def generate(n: int) -> None:
        generator.generate_batch(tokens, max_length=n, min_length=n, sampling_topk=1, include_prompt_in_result=False)

    ttft, rate, runs = timed(generate, new_tokens, len(prompts), repeat)
    return BenchRow(f"CTranslate2 {compute_type}", load_s, ttft, rate, peak_rss_mb(),
                    f"ctranslate2 {ctranslate2.__version__}", runs)


def bench_rows(job: BenchJob) -> list[PlannedRow]:
    def row(compute_type: str):
        return lambda: bench_ctranslate2(job.source, job.prompts, job.new_tokens, job.threads, job.repeat,
                                         compute_type, job.work)

    return [(f"ctranslate2 {ct}", row(ct)) for ct in ("float32", "int8")]


class CTranslate2Scorer:
    def __init__(self, model_dir: Path, quantization: str, threads: int, id_to_token: Callable[[int], str],
                 vocab_size: int, context_length: int):
        import ctranslate2

        self.generator = ctranslate2.Generator(str(model_dir), device="cpu", compute_type=quantization,
                                               intra_threads=threads)
        self.id_to_token = id_to_token
        self.vocab_size, self.context_length = vocab_size, context_length
        self.resolved = self.generator.compute_type  # what it resolved to on this CPU
        self.info = PeerInfo(f"ctranslate2 {quantization}", f"ctranslate2 {ctranslate2.__version__}",
                             "fp32" if quantization == "float32" else "int8", f"CTranslate2 {self.resolved}",
                             (model_dir / "model.bin").stat().st_size)

    def logits(self, ids: np.ndarray) -> np.ndarray:
        return np.asarray(self.generator.forward_batch([ids.tolist()]), dtype=np.float32)[0]  # (L, V)

    def greedy(self, prompt: list[int], max_new_tokens: int, eos_id: int | None) -> Greedy:
        steps = self.generator.generate_tokens([self.id_to_token(i) for i in prompt], max_length=max_new_tokens,
                                               sampling_topk=1, end_token=None if eos_id is None else [eos_id])

        def ids():  # generate_tokens stops on eos without yielding it; gptedge's ids keep it (greedy agreement)
            n = 0
            for step in steps:
                n += 1
                yield step.token_id
            if eos_id is not None and n < max_new_tokens:
                yield eos_id

        return timed_greedy(ids(), max_new_tokens, eos_id)


def scorer(recipe: str, job: ScoreJob) -> CTranslate2Scorer:
    """recipe: a CTranslate2 quantization (int8, int8_float32, float32, ...), also the compute type."""
    return CTranslate2Scorer(ctranslate2_model_dir(job.source, recipe, job.work), recipe, job.threads,
                             job.id_to_token, job.vocab_size, job.context_length)


ENGINE = PeerEngine("ctranslate2", needs=("ctranslate2", "torch", "transformers"), install="ctranslate2",
                    bench=bench_rows, recipes=("int8", "int8_float32"), scorer=scorer)
