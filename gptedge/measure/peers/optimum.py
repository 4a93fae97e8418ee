"""Optimum's ORTModelForCausalLM: its own export of the checkpoint (fp32) and its dynamic INT8 (ORTQuantizer,
avx512_vnni, per channel), as its users get them. `bench --peers optimum` times both; `compare --peers
optimum` scores the int8 one (`ORTModelForCausalLM(...)` logits, `.generate` with a streamer)."""

from __future__ import annotations

import time
import warnings
from importlib.metadata import version
from pathlib import Path

import numpy as np

from gptedge.measure.bench import BenchRow, peak_rss_mb

from .base import BenchJob, Greedy, PeerEngine, PeerInfo, PlannedRow, ScoreJob, decode_rate, timed

OPTIMUM_INT8 = "dynamic int8 (avx512_vnni, per-channel)"  # Optimum's dynamic recipe, as its users get it


def optimum_model_dir(source: Path, int8: bool, work: Path) -> Path:
    """Optimum's export of the checkpoint under `work` (once), and with int8 its dynamic INT8 quantization."""
    from optimum.onnxruntime import ORTModelForCausalLM, ORTQuantizer
    from optimum.onnxruntime.configuration import AutoQuantizationConfig

    fp32_dir = work / "optimum-fp32"
    if not fp32_dir.exists():
        with warnings.catch_warnings():  # torch.onnx's tracer warnings about transformers' code, not the user's
            warnings.simplefilter("ignore")
            ORTModelForCausalLM.from_pretrained(source, export=True).save_pretrained(fp32_dir)
    if not int8:
        return fp32_dir
    model_dir = work / "optimum-int8"
    if not model_dir.exists():
        quantizer = ORTQuantizer.from_pretrained(fp32_dir)
        quantizer.quantize(save_dir=model_dir, quantization_config=AutoQuantizationConfig.avx512_vnni(
            is_static=False, per_channel=True))
        for f in fp32_dir.glob("*.json"):
            if not (model_dir / f.name).exists():
                (model_dir / f.name).write_bytes(f.read_bytes())
    return model_dir


def load_optimum(model_dir: Path, threads: int):
    """ORTModelForCausalLM on CPU with `threads` intra-op threads."""
    import onnxruntime as ort
    from optimum.onnxruntime import ORTModelForCausalLM

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    name = next(p.name for p in model_dir.glob("*.onnx"))
    return ORTModelForCausalLM.from_pretrained(model_dir, file_name=name, session_options=options,
                                               provider="CPUExecutionProvider")


def bench_optimum(source: Path, prompts, new_tokens: int, threads: int, repeat: int, int8: bool,
                  work: Path) -> BenchRow:
    import onnxruntime as ort
    import torch

    model_dir = optimum_model_dir(source, int8, work)
    t0 = time.perf_counter()
    model = load_optimum(model_dir, threads)
    load_s = time.perf_counter() - t0
    ids = torch.tensor(prompts)

    def generate(n: int) -> None:
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                       do_sample=False, pad_token_id=0)

    ttft, rate, runs = timed(generate, new_tokens, len(prompts), repeat)
    label = "Optimum ORT " + (OPTIMUM_INT8 if int8 else "fp32")
    return BenchRow(label, load_s, ttft, rate, peak_rss_mb(), f"onnxruntime {ort.__version__}", runs)


def bench_rows(job: BenchJob) -> list[PlannedRow]:
    def row(int8: bool):
        return lambda: bench_optimum(job.source, job.prompts, job.new_tokens, job.threads, job.repeat, int8, job.work)

    return [("optimum fp32", row(False)), ("optimum int8", row(True))]


class OptimumScorer:
    resolved = None

    def __init__(self, model_dir: Path, int8: bool, threads: int, vocab_size: int, context_length: int):
        self.model = load_optimum(model_dir, threads)
        self.vocab_size, self.context_length = vocab_size, context_length
        size = sum(f.stat().st_size for f in model_dir.iterdir() if f.suffix in (".onnx", ".data")
                   or f.name.endswith(".onnx_data"))
        self.info = PeerInfo("optimum int8" if int8 else "optimum fp32", f"optimum-onnx {version('optimum-onnx')}",
                             "int8" if int8 else "fp32", "Optimum " + (OPTIMUM_INT8 if int8 else "fp32"), size)

    def logits(self, ids: np.ndarray) -> np.ndarray:
        import torch

        x = torch.from_numpy(ids)[None]  # (1, L)
        with torch.inference_mode():
            return self.model(input_ids=x, attention_mask=torch.ones_like(x)).logits[0].float().numpy()

    def greedy(self, prompt: list[int], max_new_tokens: int, eos_id: int | None) -> Greedy:
        import torch

        streamer = _TimedStreamer()
        x = torch.tensor([prompt])
        extra = {} if eos_id is None else {"eos_token_id": eos_id, "pad_token_id": eos_id}
        with torch.inference_mode():
            self.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens, do_sample=False,
                                streamer=streamer, **extra)
        return Greedy(streamer.ids, decode_rate(len(streamer.ids), streamer.times[0], streamer.times[-1]))


class _TimedStreamer:
    """transformers' streamer protocol: put() gets the prompt once, then each new token as it is chosen."""

    def __init__(self):
        self.ids: list[int] = []
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.times.append(time.perf_counter())
        self.ids.extend(int(t) for t in value.reshape(-1).tolist())

    def end(self) -> None:
        pass


def scorer(recipe: str, job: ScoreJob) -> OptimumScorer:
    """recipe "int8" (Optimum's dynamic INT8) or "fp32" (its plain export)."""
    int8 = recipe == "int8"
    return OptimumScorer(optimum_model_dir(job.source, int8, job.work), int8, job.threads, job.vocab_size,
                         job.context_length)


ENGINE = PeerEngine("optimum", needs=("torch", "optimum.onnxruntime"), install="optimum", bench=bench_rows,
                    recipes=("int8",), scorer=scorer)
