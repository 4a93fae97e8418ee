"""Parity rung 6 on a GPU for GPT-2's descendants: Llama (GQA, untied), Qwen2 (q/k/v biases) and GPT-NeoX (partial
rotary, parallel residual) on the CUDA provider against the CPU fp32 graph.

Tiny seeded checkpoints written by transformers (tests/support/lineage_checkpoints.py), exported as kv_buffer dirs
(the GPU's
graph variant), then fp16 and weight-only 4-bit with fp16 activations, as a user takes them to a GPU. Skipped where
ONNX Runtime has no CUDA execution provider (CI has none); `pytest -m cuda` on a machine with onnxruntime-gpu.
"""

from __future__ import annotations

import numpy as np
import pytest

from gptedge.runtime.graphs.session import CUDA_PROVIDER, available_providers

from ..support.lineage_checkpoints import write_variant_checkpoint

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(CUDA_PROVIDER not in available_providers(),
                                                   reason="no CUDA execution provider in this onnxruntime")]

VARIANTS = ["gqa2-linear", "qwen2-qkv-bias", "neox-parallel"]
# token ids, not text: the tiny tokenizer's vocabulary is bytes and a few words; 3 prompts of different lengths
PROMPTS = [[1, 40, 71, 90, 12], [1, 200, 17], [1, 5, 6, 7, 8, 9, 10, 11, 250]]
NEW = 20


@pytest.fixture(scope="module", params=VARIANTS)
def dirs(request, tmp_path_factory):
    from gptedge.export.exporter import export_checkpoint
    from gptedge.quantize.quantizer import QuantizeRecipe, quantize_model_dir

    root = tmp_path_factory.mktemp(request.param)
    ckpt = write_variant_checkpoint(root / "ckpt", request.param)
    export_checkpoint(ckpt, root / "fp32", graph_variant="kv_buffer")
    quantize_model_dir(root / "fp32", root / "fp16", QuantizeRecipe(method="fp16"))
    quantize_model_dir(root / "fp32", root / "wo4", QuantizeRecipe(method="weight-only", bits=4, float16=True))
    return {"name": request.param, "fp32": root / "fp32", "fp16": root / "fp16", "wo4": root / "wo4"}


def _greedy(model_dir, device, **session):
    from gptedge.runtime import SessionConfig, load

    model = load(model_dir, device=device, **({"session": SessionConfig(**session)} if session else {}))
    return model, [r.ids for r in model.generate_batch(PROMPTS, NEW, greedy=True, ignore_eos=True)]


def _leading_same(want, got) -> int:
    """Greedy tokens identical before each row's first difference, summed over rows."""
    return sum(next((i for i, (a, b) in enumerate(zip(w, g, strict=True)) if a != b), len(w))
               for w, g in zip(want, got, strict=True))


def _teacher_forced_logits(model, ids: list[int]) -> np.ndarray:
    """(L, V) float32 logits of one sequence in one prefill run."""
    x = np.asarray([ids], np.int64)
    logits, _ = model.forward(x, np.ones_like(x), np.arange(len(ids), dtype=np.int64)[None], model.empty_past(1))
    return np.asarray(logits, np.float32)[0]


def test_fp32_on_cuda_decodes_as_the_cpu(dirs):
    """ONNX Runtime's CUDA GroupQueryAttention has no fp32 kernel: an fp32 kv_buffer dir keeps its attention and cache
    on the CPU (the rest on the GPU) and decodes exactly as the CPU does."""
    model, got = _greedy(dirs["fp32"], "cuda")
    assert model.providers[0] == CUDA_PROVIDER and model.variant.kv_device == "cpu"
    _, want = _greedy(dirs["fp32"], "cpu")
    same = _leading_same(want, got)
    print(f"{dirs['name']} fp32 CUDA vs CPU: {same}/{NEW * len(PROMPTS)} leading greedy tokens identical")
    assert same == NEW * len(PROMPTS)


def test_fp16_on_cuda_follows_cpu_fp32_logits(dirs):
    """fp16 weights and activations: logits of the CPU's fp32 graph within fp16's tolerance, top-1 mostly kept (a
    random tiny model's top two are often near ties, so the greedy path itself is not asserted)."""
    from gptedge.runtime import load

    cpu, gpu = load(dirs["fp32"], device="cpu"), load(dirs["fp16"], device="cuda")
    ids = _greedy(dirs["fp32"], "cpu")[1][2]  # a generated sequence: prompt and continuation
    want, got = _teacher_forced_logits(cpu, ids), _teacher_forced_logits(gpu, ids)
    diff, top1 = float(np.abs(want - got).max()), float((want.argmax(-1) == got.argmax(-1)).mean())
    print(f"{dirs['name']} fp16 CUDA vs fp32 CPU: max |logit diff| {diff:.4f}, top-1 agreement {top1:.3f}")
    assert diff < 0.05 and top1 >= 0.9


def test_weight_only_4bit_on_cuda_follows_its_cpu_run(dirs):
    """The same MatMulNBits weights on both providers (CUDA computes in fp16, the CPU's level 4 quantizes
    activations per block): top-1 agreement on one teacher-forced sequence."""
    from gptedge.runtime import load

    cpu, gpu = load(dirs["wo4"], device="cpu"), load(dirs["wo4"], device="cuda")
    ids = _greedy(dirs["fp32"], "cpu")[1][0]
    want, got = _teacher_forced_logits(cpu, ids), _teacher_forced_logits(gpu, ids)
    top1 = float((want.argmax(-1) == got.argmax(-1)).mean())
    print(f"{dirs['name']} wo4 CUDA vs wo4 CPU: top-1 agreement {top1:.3f}, max |diff| {np.abs(want - got).max():.3f}")
    assert top1 >= 0.85


def test_cuda_graphs_capture_the_family_and_decode_as_the_ordinary_path(dirs):
    graphs, got = _greedy(dirs["fp16"], "cuda")
    _, want = _greedy(dirs["fp16"], "cuda", cuda_graph=False)
    assert graphs.variant.cuda_graphs is not None and graphs.variant.cuda_graphs.failed is None
    same = _leading_same(want, got)
    print(f"{dirs['name']} CUDA graphs vs ordinary: {same}/{NEW * len(PROMPTS)} leading greedy tokens identical")
    assert same >= 0.95 * NEW * len(PROMPTS)


def test_the_engine_on_cuda_serves_the_family_as_generate(dirs):
    from gptedge.runtime import load
    from gptedge.runtime.generation.sampling import SamplingParams
    from gptedge.runtime.graphs.device_slot_pool import DeviceSlotPool
    from gptedge.runtime.serving.engine import CompletionRequest, Engine

    from ..support.engine import Collector

    model = load(dirs["fp16"], device="cuda")
    solo = [model.generate(p, 12, greedy=True, ignore_eos=True).ids for p in PROMPTS]
    engine = Engine(model, max_batch=4, max_queue=8, prefill_chunk=4).start()
    assert isinstance(engine.pool, DeviceSlotPool)
    got = [Collector() for _ in PROMPTS]
    for p, c in zip(PROMPTS, got, strict=True):
        engine.submit(CompletionRequest(tuple(p), 12, sampling=SamplingParams(greedy=True), ignore_eos=True), c)
    assert all(c.finished() for c in got)
    engine.stop(grace_s=1)
    same = _leading_same(solo, [c.last.generation.ids for c in got])
    print(f"{dirs['name']} engine on CUDA vs generate: {same}/{12 * len(PROMPTS)} leading greedy tokens identical")
    assert same >= 0.9 * 12 * len(PROMPTS)
