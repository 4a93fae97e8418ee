"""Parity rung 6 on a GPU: the CUDA provider against the CPU fp32 graph, on the shipped sample model.

Skipped where ONNX Runtime has no CUDA execution provider (CI has none); run with `pytest -m cuda` on a
machine with onnxruntime-gpu. Thresholds: measured on an H100 (benchmarks/results/gpu-*.md), with margin.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gptedge.runtime.graphs.session import CUDA_PROVIDER, available_providers

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(CUDA_PROVIDER not in available_providers(),
                                                   reason="no CUDA execution provider in this onnxruntime")]

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "sample-model"
PROMPTS = ["It is a truth universally acknowledged, that", "The", "Mr. Darcy walked into the room and"]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """The sample model: fp32 kv_buffer and standard (CPU reference), fp16 of each, weight-only int8 fp16."""
    from gptedge.export.exporter import export_checkpoint
    from gptedge.quantize.quantizer import QuantizeRecipe, quantize_model_dir

    root = tmp_path_factory.mktemp("cuda")
    out = {}
    for graph in ("kv_buffer", "standard"):
        export_checkpoint(SAMPLE, root / f"fp32-{graph}", graph_variant=graph)
        out[f"fp32-{graph}"] = root / f"fp32-{graph}"
        quantize_model_dir(root / f"fp32-{graph}", root / f"fp16-{graph}", QuantizeRecipe(method="fp16"))
        out[f"fp16-{graph}"] = root / f"fp16-{graph}"
    quantize_model_dir(root / "fp32-kv_buffer", root / "wo8", QuantizeRecipe(method="weight-only", float16=True))
    out["wo8"] = root / "wo8"
    return out


@pytest.mark.parametrize("graph", ["kv_buffer", "standard"])
def test_fp16_on_cuda_against_cpu_fp32_is_recorded(dirs, graph):
    check = json.loads((dirs[f"fp16-{graph}"] / "gptedge.json").read_text())["parity"]["vs_fp32"]
    assert check["device"] == "cuda"
    assert check["max_abs_logit_diff"] < 0.25 and check["top1_agreement"] >= 0.98
    assert check["greedy_agreement"] >= 0.75


def _greedy(model_dir, device, n=24):
    from gptedge.runtime import load

    model = load(model_dir, device=device)
    return [r.ids for r in model.generate_batch(PROMPTS, n, greedy=True, ignore_eos=True)]


def test_fp16_greedy_on_cuda_follows_cpu_fp32(dirs):
    want, got = _greedy(dirs["fp32-kv_buffer"], "cpu"), _greedy(dirs["fp16-kv_buffer"], "cuda")
    lead = [next((i for i, (a, b) in enumerate(zip(x, y, strict=False)) if a != b), len(x))
            for x, y in zip(want, got, strict=True)]
    assert sum(lead) >= 0.75 * sum(map(len, want)), lead


def test_device_argmax_equals_host_argmax_on_cuda(dirs):
    from gptedge.runtime import load
    from gptedge.runtime.generation.generation import left_pad, positions

    model = load(dirs["fp16-kv_buffer"], device="cuda")
    assert model.providers[0] == CUDA_PROVIDER and model.variant.kv_device == "cuda"
    ids, mask = left_pad([model.tokenizer.encode(p).ids for p in PROMPTS], 0)
    a, b = model.variant.start(3, ids.shape[1] + 8), model.variant.start(3, ids.shape[1] + 8)
    pos = positions(mask)
    for _ in range(8):  # step both caches with the same tokens: the device pick equals numpy's on the logits
        tok = a.run_argmax(ids, mask, pos).copy()
        np.testing.assert_array_equal(tok, b.run(ids, mask, pos).argmax(-1))
        ids, mask = tok[:, None], np.concatenate([mask, np.ones((3, 1), np.int64)], axis=1)
        pos = mask.sum(axis=1, keepdims=True) - 1


def test_weight_only_int8_runs_on_cuda(dirs):
    check = json.loads((dirs["wo8"] / "gptedge.json").read_text())["parity"]["vs_fp32"]
    assert check["device"] == "cuda" and check["top1_agreement"] >= 0.9
    assert all(len(ids) == 24 for ids in _greedy(dirs["wo8"], "cuda"))


def test_sampling_and_beams_on_cuda(dirs):
    from gptedge.runtime import load

    model = load(dirs["fp16-kv_buffer"], device="cuda")
    a = model.generate(PROMPTS[0], 16, top_k=20, top_p=0.9, seed=3, ignore_eos=True)
    assert a.ids == model.generate(PROMPTS[0], 16, top_k=20, top_p=0.9, seed=3, ignore_eos=True).ids
    beams = model.beam_search([PROMPTS[0]], 8, num_beams=3, num_return_sequences=3)[0]
    assert len(beams.sequences) == 3 and beams.scores == sorted(beams.scores, reverse=True)


def test_info_shows_the_gpu(dirs):
    r = subprocess.run([sys.executable, "-m", "gptedge.cli", "info", str(dirs["fp16-kv_buffer"]), "--device", "cuda"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["providers_used"][0] == CUDA_PROVIDER and info["gpus"] and info["gpus"][0]["name"]
    assert "device_id" in info["provider_options"][CUDA_PROVIDER]


def test_cuda_graphs_decode_as_the_ordinary_path(dirs):
    """Decode steps replayed as CUDA graphs (runtime/graphs/cuda_graph.py) pick the ordinary path's tokens, at batch 1
    and on a left-padded batch of 3, in a first generation (capture) and a second (replay); sampling reads the same
    logits (same seed, same tokens)."""
    from gptedge.runtime import SessionConfig, load
    from gptedge.runtime.graphs.cuda_graph import GraphDecodeState

    graphs = load(dirs["fp16-kv_buffer"], device="cuda")
    plain = load(dirs["fp16-kv_buffer"], device="cuda", session=SessionConfig(cuda_graph=False))
    assert graphs.variant.cuda_graphs is not None and plain.variant.cuda_graphs is None
    assert isinstance(graphs.variant.start(3, 40), GraphDecodeState)
    same = total = 0
    for batch in (PROMPTS[:1], PROMPTS, PROMPTS):
        want = plain.generate_batch(batch, 24, greedy=True, ignore_eos=True)
        got = graphs.generate_batch(batch, 24, greedy=True, ignore_eos=True)
        for w, g in zip(want, got, strict=True):
            same += next((i for i, (a, b) in enumerate(zip(w.ids, g.ids, strict=False)) if a != b), len(w.ids))
            total += len(w.ids)
    assert graphs.variant.cuda_graphs.failed is None
    print(f"CUDA graphs vs ordinary: {same}/{total} leading greedy tokens identical")
    assert same >= 0.95 * total
    a = graphs.generate(PROMPTS[0], 16, top_k=20, seed=3, ignore_eos=True)
    b = plain.generate(PROMPTS[0], 16, top_k=20, seed=3, ignore_eos=True)
    assert a.ids[:8] == b.ids[:8]


def test_the_engine_on_cuda_serves_from_device_slots_as_generate(dirs):
    """`serve --device cuda`: the engine's pool is the GPU's slot pool (runtime/graphs/device_slot_pool.py), its decode
    step one captured graph over every slot; greedy requests get generate()'s tokens."""
    from gptedge.runtime import load
    from gptedge.runtime.graphs.device_slot_pool import DeviceSlotPool
    from gptedge.runtime.serving.engine import CompletionRequest, Engine
    from gptedge.runtime.generation.sampling import SamplingParams

    from ..support.engine import Collector

    model = load(dirs["fp16-kv_buffer"], device="cuda")
    prompts = [model.encode(p) for p in PROMPTS] * 3
    solo = [model.generate(p, 16, greedy=True, ignore_eos=True).ids for p in prompts]
    engine = Engine(model, max_batch=4, max_queue=16, prefill_chunk=8)
    engine._ahead.min_rows = 1  # steps run ahead from one row (MIN_ROWS is 16): that path checked on the GPU too
    engine.start()
    assert isinstance(engine.pool, DeviceSlotPool)
    got = [Collector() for _ in prompts]
    for p, c in zip(prompts, got, strict=True):
        engine.submit(CompletionRequest(tuple(p), 16, sampling=SamplingParams(greedy=True), ignore_eos=True), c)
    assert all(c.finished() for c in got)
    engine.stop(grace_s=1)
    assert model.variant.cuda_graphs.failed is None
    same = sum(next((i for i, (a, b) in enumerate(zip(w, c.last.generation.ids, strict=False)) if a != b), len(w))
               for w, c in zip(solo, got, strict=True))
    print(f"engine on CUDA vs generate: {same}/{16 * len(prompts)} leading greedy tokens identical, "
          f"{engine._ahead.launched} steps run ahead of their tokens' emission")
    assert same >= 0.9 * 16 * len(prompts)
    assert engine._ahead.launched > 0  # every row greedy: once the queue is empty, each step goes out early
