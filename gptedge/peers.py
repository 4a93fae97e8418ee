"""Peer engines for `gptedge bench --peers`, on the same weights and prompt ids, in the same process.

transformers' PyTorch generate, Optimum's ORTModelForCausalLM (fp32 and its dynamic INT8),
CTranslate2 (float32 and int8), and ONNX Runtime GenAI on the benchmarked model dir itself. Each needs
its package (`errors.install_hint('peers')`); a missing one is
reported as a row note, not an error. The conversions and loaders (`ctranslate2_model_dir`,
`optimum_model_dir`, `load_optimum`, `with_hf_tokenizer`) are also those of compare's peers (peer_accuracy.py).
"""

from __future__ import annotations

import logging
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from gptedge.runtime.bench import BenchRow, peak_rss_mb
from gptedge.runtime.errors import install_hint

log = logging.getLogger(__name__)
PEERS = ("torch", "optimum", "ctranslate2", "genai")


def _timed(generate: Callable[[int], None], new_tokens: int, batch: int, repeat: int,
           sync: Callable[[], None] = lambda: None) -> tuple[float, float, list[float]]:
    """-> (time to first token, decode tok/s, each run's tok/s) from generate(n) producing n tokens per row.
    sync: waits for queued GPU work (torch.cuda.synchronize) before each clock read."""
    generate(2)  # warm-up (and compilation)
    sync()
    ttfts, rates = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        generate(1)
        sync()
        ttft = time.perf_counter() - t0
        t0 = time.perf_counter()
        generate(new_tokens)
        sync()
        total = time.perf_counter() - t0
        ttfts.append(ttft)
        rates.append(batch * (new_tokens - 1) / max(total - ttft, 1e-9))
    return statistics.median(ttfts), statistics.median(rates), rates


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

    ttft, rate, runs = _timed(generate, new_tokens, len(prompts), repeat)
    return BenchRow("transformers (PyTorch eager) fp32", load_s, ttft, rate, peak_rss_mb(), f"torch {torch.__version__}", runs)


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

    ttft, rate, runs = _timed(generate, new_tokens, len(prompts), repeat)
    label = "Optimum ORT " + (OPTIMUM_INT8 if int8 else "fp32")
    return BenchRow(label, load_s, ttft, rate, peak_rss_mb(), f"onnxruntime {ort.__version__}", runs)


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

    ttft, rate, runs = _timed(generate, new_tokens, len(prompts), repeat)
    return BenchRow(f"CTranslate2 {compute_type}", load_s, ttft, rate, peak_rss_mb(), f"ctranslate2 {ctranslate2.__version__}", runs)


def bench_genai(model_dir: Path, prompts, new_tokens: int, threads: int | None, repeat: int,
                device: str = "cpu") -> BenchRow:
    """ONNX Runtime GenAI's C++ loop on the very dir gptedge ran (its genai_config.json), same prompt ids.

    min_length = max_length keeps it going past eos, as gptedge's bench does (ignore_eos). device "cuda":
    GenAI's CUDA provider (onnxruntime-genai-cuda); threads None: GenAI's default."""
    import json

    import numpy as np
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

    ttft, rate, runs = _timed(generate, new_tokens, len(prompts), repeat)
    return BenchRow(f"ONNX Runtime GenAI ({model_dir.name})", load_s, ttft, rate, peak_rss_mb(),
                    f"onnxruntime-genai {og.__version__}", runs)


def with_hf_tokenizer(source: Path, model_dir: Path, work: Path) -> Path:
    """transformers and CTranslate2's converter want tokenizer.json or vocab.json beside the weights;
    a checkpoint with only GPT-2's original encoder.json / vocab.bpe gets the model dir's tokenizer.json."""
    if (source / "tokenizer.json").is_file() or (source / "vocab.json").is_file():
        return source
    linked = work / "source"
    linked.mkdir()
    for f in source.iterdir():
        (linked / f.name).symlink_to(f.resolve())
    (linked / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    return linked


def bench_peers(names: list[str], source: Path | None, model_dir: Path, prompts, new_tokens: int, threads: int,
                repeat: int) -> list[BenchRow]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="gptedge-peers-") as tmp:
        work = Path(tmp)
        source = with_hf_tokenizer(source, model_dir, work) if source else None
        plan = []
        for name in names:
            if name == "genai":
                plan.append(("genai", lambda: bench_genai(model_dir, prompts, new_tokens, threads, repeat)))
            elif name == "torch":
                plan.append(("transformers", lambda: bench_torch(source, prompts, new_tokens, threads, repeat)))
            elif name == "optimum":
                plan.append(("optimum fp32", lambda: bench_optimum(source, prompts, new_tokens, threads, repeat, False, work)))
                plan.append(("optimum int8", lambda: bench_optimum(source, prompts, new_tokens, threads, repeat, True, work)))
            elif name == "ctranslate2":
                for ct in ("float32", "int8"):
                    plan.append((f"ctranslate2 {ct}",
                                 lambda ct=ct: bench_ctranslate2(source, prompts, new_tokens, threads, repeat, ct, work)))
            else:
                raise ValueError(f"unknown peer {name!r}: choose from {', '.join(PEERS)}")
        for label, run in plan:
            try:
                rows.append(run())
            except ImportError as e:
                rows.append(BenchRow(label, 0, 0, 0, peak_rss_mb(), f"not run: {e.name} not installed ({install_hint('peers')})"))
            log.info("bench %s done", label)
    return rows
