"""Which dirs a web pack takes, and as which transformers.js dtype (runtime/modeldir/web_ready.py), read off
manifests built in memory: each recipe, each refusal and its one line as `gptedge info` prints it. No export
(test_pack_web.py checks the same on real dirs)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from gptedge.runtime.modeldir.manifest import Manifest, ModelShape, Quantization, Source
from gptedge.runtime.modeldir.web_ready import DTYPE_SUFFIX, WASM_CONTRIB_OPS, recipe_dtype, web_readiness

SHAPE = ModelShape("gpt2", 2, 4, 8, 100, 64)
FP32 = Manifest(SHAPE, source=Source(contrib_ops=("MultiHeadAttention", "FastGelu")))


def _quantized(**recipe) -> Manifest:
    return dataclasses.replace(FP32, quantization=Quantization(**recipe))


@pytest.mark.parametrize("manifest, dtype, file_name, line", [
    (FP32, "fp32", "onnx/model.onnx", "yes: transformers.js dtype 'fp32' (fp32) on onnxruntime-web WASM"),
    (_quantized(method="dynamic", bits=8), "q8", "onnx/model_quantized.onnx",
     "yes: transformers.js dtype 'q8' (dynamic) on onnxruntime-web WASM"),
    (_quantized(method="static", bits=8), "uint8", "onnx/model_uint8.onnx",
     "yes: transformers.js dtype 'uint8' (static) on onnxruntime-web WASM"),
    (_quantized(method="weight-only", bits=8), "int8", "onnx/model_int8.onnx",
     "yes: transformers.js dtype 'int8' (weight-only) on onnxruntime-web WASM"),
    (_quantized(method="weight-only", bits=4), "q4", "onnx/model_q4.onnx",
     "yes: transformers.js dtype 'q4' (weight-only int4 b32 asym, emb int8) on onnxruntime-web WASM"),
])
def test_each_cpu_recipe_is_ready_as_its_dtype(manifest, dtype, file_name, line):
    ready = web_readiness(manifest)
    assert (ready.ready, ready.dtype, ready.file_name, str(ready)) == (True, dtype, file_name, line)


@pytest.mark.parametrize("manifest, dtype, line", [
    (dataclasses.replace(FP32, precision="fp16"), None,
     "no: an fp16 graph (a GPU recipe: WASM has no fp16 attention)"),
    (_quantized(method="fp16", bits=16), None, "no: fp16 (a GPU recipe: WASM has no fp16 attention)"),
    (_quantized(method="weight-only", bits=4, float16=True), None,
     "no: weight-only int4 b32 asym, emb int8, fp16 activations (a GPU recipe: WASM has no fp16 attention)"),
    (dataclasses.replace(FP32, quantization=SimpleNamespace(method="gptq", float16=False, label="gptq")), None,
     "no: an unknown quantization method 'gptq'"),  # a method newer than this gptedge
    (dataclasses.replace(FP32, graph="kv_buffer"), "fp32",
     "no: a kv_buffer graph: transformers.js feeds Optimum's growing past tensors; pack an export made with "
     "--graph standard (quantized the same way)"),
    (dataclasses.replace(FP32, source=Source(contrib_ops=("GroupQueryAttention", "Zeta", "Alpha"))), "fp32",
     "no: uses Alpha, which onnxruntime-web's WASM build lacks: export with --plain-ops"),  # the first, sorted
    (dataclasses.replace(FP32, task=SimpleNamespace(name="entailment")), None,
     "no: an entailment classifier: web packs hold language models (transformers.js text generation)"),
    (dataclasses.replace(FP32, task=SimpleNamespace(name="similarity")), None,
     "no: a similarity classifier: web packs hold language models (transformers.js text generation)"),
])
def test_each_refusal_says_why_in_one_line(manifest, dtype, line):
    ready = web_readiness(manifest)
    assert (ready.ready, ready.dtype, str(ready)) == (False, dtype, line)


def test_every_contrib_op_gptedge_writes_is_taken():
    ops = ("MultiHeadAttention", "GroupQueryAttention", "FastGelu", "SkipLayerNormalization", "MatMulNBits",
           "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QuickGelu", "BiasGelu", "Gelu")
    assert WASM_CONTRIB_OPS == frozenset(ops)
    assert web_readiness(dataclasses.replace(FP32, source=Source(contrib_ops=ops))).ready


def test_dtype_suffixes_are_transformers_js():
    assert DTYPE_SUFFIX == {"fp32": "", "fp16": "_fp16", "q8": "_quantized", "int8": "_int8", "uint8": "_uint8",
                            "q4": "_q4"}
    assert recipe_dtype(FP32) == ("fp32", "fp32")


def test_a_readiness_is_an_immutable_value():
    with pytest.raises(dataclasses.FrozenInstanceError):
        web_readiness(FP32).ready = False  # type: ignore[misc]
