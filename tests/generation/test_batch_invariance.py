"""What README promises of generate_batch against one-by-one generate: for prompts of one
length (no left padding) every recipe, 4-bit weight-only included, computes each row exactly as it computes it
alone (bitwise equal logits, identical greedy ids). Across lengths only float graphs are promised equal to within
float rounding: recipes that quantize activations inside a kernel can flip a rounding there (docs/python-api.md;
the measured figures are in benchmarks/results/batch-invariance-2026-11-24.md)."""

from __future__ import annotations

import numpy as np
import pytest

from gptedge.runtime import load
from gptedge.runtime.generation.generation import left_pad, prefill

RECIPES = {
    "int4-asym": dict(method="weight-only", bits=4),
    "int4-sym": dict(method="weight-only", bits=4, symmetric=True),
    "int8-weight-only": dict(method="weight-only"),
    "dynamic": dict(method="dynamic"),
}


@pytest.fixture(scope="module")
def quantized(tmp_path_factory, gpt2_model_dir):
    from gptedge.quantize.quantizer import QuantizeRecipe, quantize_model_dir

    base = tmp_path_factory.mktemp("invariance")
    for name, recipe in RECIPES.items():
        quantize_model_dir(gpt2_model_dir, base / name, QuantizeRecipe(**recipe))
    return base


def last_logits(model, prompts) -> np.ndarray:
    ids, mask = left_pad(prompts, 0)
    return prefill(model.variant.start(len(prompts), ids.shape[1] + 1), ids, mask, chunk=None).copy()


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_one_length_batches_equal_one_by_one_generation_exactly(quantized, recipe):
    model = load(quantized / recipe, device="cpu")
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, model.manifest.shape.vocab_size, 12).tolist() for _ in range(16)]
    batch = model.generate_batch(prompts, max_new_tokens=12, greedy=True, ignore_eos=True)
    for prompt, row in zip(prompts, batch, strict=True):
        assert row.ids == model.generate(prompt, max_new_tokens=12, greedy=True, ignore_eos=True).ids
    together = last_logits(model, prompts)
    alone = np.concatenate([last_logits(model, [p]) for p in prompts])
    assert np.array_equal(together, alone)  # bitwise: no float summation order depends on the batch
