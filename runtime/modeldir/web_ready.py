"""Which model dirs run in a web browser, and under which transformers.js dtype name (`gptedge info`, `gptedge pack`).

The browser target is transformers.js (`@huggingface/transformers`) on onnxruntime-web's WASM backend. It loads a
folder with `onnx/model{suffix}.onnx`, the suffix naming the graph's dtype, and drives the graph itself: it feeds
Optimum's I/O contract (separate past and present tensors that grow one position a step), so gptedge's `standard`
graph fits and the `kv_buffer` graph (one preallocated buffer bound as both) does not.

Contrib ops: every ONNX Runtime contrib op gptedge writes is in onnxruntime-web's WASM build (checked on
onnxruntime-web 1.31.0-dev, the build transformers.js 4.3.1 pins: a session is created for each graph kind in
tests/web/test_web_node.py), so no recipe needs the `--plain-ops` fallback today; a graph using an op outside
WASM_CONTRIB_OPS is refused by `pack` with that hint.

dtype names follow transformers.js (`DEFAULT_DTYPE_SUFFIX_MAPPING` in its source): fp32 -> model.onnx,
q8 -> model_quantized.onnx, int8 -> model_int8.onnx, uint8 -> model_uint8.onnx, q4 -> model_q4.onnx,
fp16 -> model_fp16.onnx. gptedge's recipes map to the nearest meaning:

| recipe | dtype | why |
|---|---|---|
| fp32 | fp32 | |
| dynamic INT8 | q8 | transformers.js' q8 is ONNX Runtime's dynamic quantization too (and WASM's default dtype) |
| weight-only 8-bit | int8 | signed 8-bit weights; no dynamic activation quantization in the graph |
| static INT8 (QDQ) | uint8 | u8 activations with calibrated ranges |
| weight-only 4-bit | q4 | MatMulNBits 4-bit blocks, as transformers.js' own q4 |

fp16 graphs and weight-only `--float16` are GPU recipes: ONNX Runtime's CPU kernels (so WASM's) have no fp16
attention, and WebGPU is not what this target runs. This module reads the manifest only (no onnx, no torch).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..contract import GRAPH_STANDARD
from .manifest import Manifest
from .tasks import article

DTYPE_SUFFIX = {"fp32": "", "fp16": "_fp16", "q8": "_quantized", "int8": "_int8", "uint8": "_uint8", "q4": "_q4"}
# Contrib ops onnxruntime-web's WASM build runs (every one gptedge writes; see the module docstring).
WASM_CONTRIB_OPS = frozenset({
    "MultiHeadAttention", "GroupQueryAttention", "FastGelu", "SkipLayerNormalization", "MatMulNBits",
    "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QuickGelu", "BiasGelu", "Gelu",
})


@dataclass(frozen=True)
class WebReadiness:
    ready: bool
    dtype: str | None  # transformers.js' name for this graph
    reason: str  # what it runs as, or why not

    def __str__(self) -> str:
        return f"{'yes' if self.ready else 'no'}: {self.reason}"

    @property
    def file_name(self) -> str:
        """The graph's path in a packed dir."""
        return f"onnx/model{DTYPE_SUFFIX[self.dtype]}.onnx"


def recipe_dtype(manifest: Manifest) -> tuple[str | None, str]:
    """(transformers.js dtype, a label of the recipe), or (None, why there is none)."""
    q = manifest.quantization
    if q is None:
        if manifest.precision == "fp16":
            return None, "an fp16 graph (a GPU recipe: WASM has no fp16 attention)"
        return "fp32", "fp32"
    if q.float16 or q.method == "fp16":
        return None, f"{q.label} (a GPU recipe: WASM has no fp16 attention)"
    if q.method == "dynamic":
        return "q8", q.label
    if q.method == "static":
        return "uint8", q.label
    if q.method == "weight-only":
        return ("q4" if q.bits == 4 else "int8"), q.label
    return None, f"an unknown quantization method {q.method!r}"


def web_readiness(manifest: Manifest) -> WebReadiness:
    """Whether transformers.js on onnxruntime-web (WASM) runs this dir as packed, and as which dtype."""
    dtype, label = recipe_dtype(manifest)
    if manifest.task is not None:  # transformers.js' text-generation layout: logits over the vocabulary, a cache
        return WebReadiness(False, None,
                            f"{article(manifest.task.name)} {manifest.task.name} classifier: web packs hold "
                            "language models "
                                         "(transformers.js text generation)")
    if dtype is None:
        return WebReadiness(False, None, label)
    if manifest.graph != GRAPH_STANDARD:
        return WebReadiness(False, dtype, f"a {manifest.graph} graph: transformers.js feeds Optimum's growing past "
                                          "tensors; pack an export made with --graph standard (quantized the same way)")
    missing = sorted(set(manifest.source.contrib_ops) - WASM_CONTRIB_OPS)
    if missing:
        return WebReadiness(False, dtype, f"uses {missing[0]}, which onnxruntime-web's WASM build lacks: "
                                          "export with --plain-ops")
    return WebReadiness(True, dtype, f"transformers.js dtype {dtype!r} ({label}) on onnxruntime-web WASM")
