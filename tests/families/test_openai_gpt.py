"""The original GPT at its real widths (768 wide, 512 context, 40,478 vocab, post-LN; 2 of its 12 blocks, since every
block is the same code and 12 cost the suite a minute), seeded random weights in transformers' OpenAIGPTLMHeadModel
layout, up the whole ladder: export parity against transformers and the
reference, dynamic INT8 and weight-only 8- and 4-bit (structure and parity), greedy ids, beam search."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
import torch

from gptedge.quantize.quantizer import QuantizeRecipe, quantize_model_dir
from gptedge.runtime import load, read_manifest

from ..support.beams import assert_same, transformers_beams
from ..support.quant import fake_quantized

transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.slow, pytest.mark.interop]

N_LAYER, N_EMBD, VOCAB, CONTEXT = 2, 768, 40478, 512  # the original's 12 blocks cut to 2
# 4-bit with float activations (accuracy level 0): its logits can then be checked against numpy's
# dequantization of the same blocks, to float rounding
RECIPES = {"dynamic": QuantizeRecipe("dynamic"), "weight-only": QuantizeRecipe("weight-only"),
           "int4": QuantizeRecipe("weight-only", bits=4, accuracy_level=0)}
LINEARS = 4 * N_LAYER + 1  # c_attn, attention c_proj, c_fc, MLP c_proj per block; the tied LM head
# vs_fp32 (64 seeded ids, recorded in the manifest at quantize time). Measured on this model at 2 blocks
# (2026-11-26, onnxruntime 1.32, AVX2): max |logit diff| dynamic 0.070, weight-only 8-bit 0.029, 4-bit 0.184 (float
# activations); top-1 100 % for all three (at 12 blocks: 0.136, 0.056, 0.445). Limits at about 2.5x the measured
# difference; a layer left float or a wrong scale moves them by far more.
VS_FP32 = {"dynamic": (0.18, 0.97), "weight-only": (0.07, 0.97), "int4": (0.46, 0.9)}  # max |diff|, min top-1


@pytest.fixture(scope="module")
def hf():
    """transformers' own OpenAIGPTLMHeadModel (seed 0, its default shape but 2 blocks), kept for the tests' oracles
    (the same weights as the checkpoint saved from it: loading 180 MB back for each test costs seconds)."""
    torch.manual_seed(0)
    config = transformers.OpenAIGPTConfig(n_layer=N_LAYER)  # the original widths: 768, 512 positions, 40,478 tokens
    assert (config.n_embd, config.vocab_size, config.n_positions) == (N_EMBD, VOCAB, CONTEXT)
    return transformers.OpenAIGPTLMHeadModel(config).eval()


@pytest.fixture(scope="module")
def gpt1(tmp_path_factory, hf):
    """That model saved, exported and quantized."""
    from gptedge.export.exporter import export_checkpoint

    base = tmp_path_factory.mktemp("openai-gpt")
    hf.save_pretrained(base / "ck")
    export_checkpoint(base / "ck", base / "fp32")
    for name, recipe in RECIPES.items():
        quantize_model_dir(base / "fp32", base / name, recipe)
    return base


@pytest.fixture(scope="module")
def fp32(gpt1):
    """The fp32 dir loaded once (an ONNX Runtime session on 180 MB of weights)."""
    return load(gpt1 / "fp32", device="cpu")


def hf_logits(hf, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.from_numpy(ids)).logits.numpy()


def test_export_matches_transformers_and_the_reference(gpt1, fp32, hf):
    model = fp32
    m = model.manifest
    assert (m.shape.arch, m.shape.n_layer, m.shape.n_embd, m.shape.vocab_size, m.shape.context_length) == \
        ("openai-gpt", N_LAYER, N_EMBD, VOCAB, CONTEXT)
    graph, greedy = m.parity.graph_vs_reference, m.parity.greedy_vs_reference  # rungs 3-4 at export
    assert graph.max_abs_diff <= 1e-4 and graph.top1_agreement == 1.0 and graph.decode_steps >= 3
    assert greedy.identical and greedy.tokens_compared == 3 * 64
    # the graph against transformers itself, over the whole context (positions 0..511)
    ids = np.random.default_rng(0).integers(0, VOCAB, size=(1, CONTEXT), dtype=np.int64)
    pos = np.broadcast_to(np.arange(CONTEXT), ids.shape).copy()
    got, _ = model.forward(ids, np.ones_like(ids), pos, model.empty_past(1))
    want = hf_logits(hf, ids)
    assert np.abs(got - want).max() <= 1e-4
    ops = Counter(n.op_type for n in onnx.load(str(gpt1 / "fp32" / "model.onnx"), load_external_data=False).graph.node)
    assert ops["LayerNormalization"] == 2 * N_LAYER and ops["Softmax"] == N_LAYER  # post-LN, no final LN


def test_greedy_ids_equal_transformers_generate(fp32, hf):
    """(Against the reference, 3 prompts x 64 tokens were compared at export.) transformers' OpenAIGPT keeps no
    cache, so its generate recomputes every step: a short run."""
    prompt = [40, 1001, 7, 23456, 311, 2]
    with torch.no_grad():
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, pad_token_id=0)[0, 6:].tolist()
    assert fp32.generate(prompt, max_new_tokens=16, greedy=True).ids == want


def test_beam_search_equals_transformers(fp32, hf):
    """A left-padded batch of two: each prompt's beams and scores equal transformers' on that prompt alone
    (transformers' OpenAIGPT numbers positions from the left edge whatever the mask says, so its own padded
    batches are not a reference; gptedge's rows are position-correct and batch-independent)."""
    model = fp32
    prompts = [[40, 1001, 7, 23456, 311, 2], [977, 12]]
    options = dict(num_beams=4, length_penalty=1.0, early_stopping=False, num_return_sequences=2)
    ours = model.beam_search(prompts, max_new_tokens=8, **options)
    for got, prompt in zip(ours, prompts, strict=True):
        assert_same([got], transformers_beams(hf, [prompt], 8, eos=None, pad=0, **options))
        assert len(got.sequences) == 2 and all(len(s) == 8 for s in got.sequences)  # no eos: full length


@pytest.mark.parametrize("name", RECIPES)
def test_quantized_structure_and_parity(gpt1, name):
    model = onnx.load(str(gpt1 / name / "model.onnx"))
    ops = Counter(n.op_type for n in model.graph.node)
    if name == "dynamic":
        assert ops["MatMulIntegerToFloat"] == ops["QuantizeLinear"] == LINEARS
    else:
        bits = Counter(next(a.i for a in n.attribute if a.name == "bits") for n in model.graph.node
                       if n.op_type == "MatMulNBits")
        assert bits == ({8: LINEARS} if name == "weight-only" else {4: LINEARS - 1, 8: 1})  # LM head 8-bit
    assert ops["MatMul"] == 2 * N_LAYER  # QK^T and PV stay float
    big = [t for t in model.graph.initializer if VOCAB in t.dims and np.prod(t.dims) >= VOCAB * 32]
    assert len(big) == 1 and big[0].data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)  # tied, once
    floats = [t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) == 2
              and min(t.dims) >= 32 and not t.name.endswith(".scales")]  # MatMulNBits' (N, K / 32) scales
    assert floats == ["wpe.weight"]  # every weight matrix quantized; the positions stay float
    vs = read_manifest(gpt1 / name).parity.vs_fp32  # recorded at quantize time
    max_diff, min_top1 = VS_FP32[name]
    assert vs.max_abs_logit_diff <= max_diff and vs.top1_agreement >= min_top1, (name, vs)


def test_int4_equals_numpy_dequantized_weights(gpt1, tmp_path):
    """At the real shape (K 768 and 3,072, N up to 40,478), the 4-bit blocks read as numpy packs them."""
    got = load(gpt1 / "int4", device="cpu")
    want = load(fake_quantized(gpt1 / "fp32", tmp_path / "fq", RECIPES["int4"]), device="cpu")
    ids = np.random.default_rng(1).integers(0, VOCAB, size=(2, 16), dtype=np.int64)
    mask, pos = np.ones_like(ids), np.broadcast_to(np.arange(16), ids.shape).copy()
    a, _ = got.forward(ids, mask, pos, got.empty_past(2))
    b, _ = want.forward(ids, mask, pos, want.empty_past(2))
    np.testing.assert_allclose(a, b, atol=2e-4 * np.abs(b).max())
