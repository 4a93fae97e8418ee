"""`quantize --kv-cache fp16|int8|int4`: store a kv_buffer graph's cache in fewer bytes (issue #23).

A decode step over a long past reads every cached key and value: at 1,024 positions GPT-2 small's fp32
cache is 75 MB a step, more than its 8-bit weights. GroupQueryAttention (ONNX Runtime's contrib op) keeps
the cache in the type the graph declares for past/present and converts on write and read, so the rewrite
is declarative: the cache tensors' type (and, for int4, their last dimension), plus for int8/int4 the
quantization attributes and two scale initializers per layer. Nothing else in the graph changes.

Scales (int8 / int4): symmetric, one per (layer, head, channel) for keys and for values ("PER_CHANNEL",
(1, nh, 1, hs)), from the largest |K| and |V| the fp32 source produces over windows of the calibration
text, times a margin, over qmax (127 or 7). Per channel because a few channels of GPT-2's keys are an
order of magnitude larger than the rest (one per-tensor scale would spend most levels on them).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from gptedge import runtime
from gptedge.runtime import contract as C
from gptedge.runtime.errors import InvalidArgumentError, QuantizationError
from gptedge.runtime.modeldir.kv_cache import DEFAULT_KV_CACHE, KVCacheKind, kv_cache_kind
from gptedge.runtime.modeldir.manifest import Manifest, read_manifest
from gptedge.runtime.modeldir.tokenizer import encode, load_tokenizer

log = logging.getLogger(__name__)

# The scale's range over the largest |K| / |V| seen in calibration. Measured (benchmarks/kv_cache_margin.py,
# the sample model, fp32 weights, 4 x 256 tokens of persuasion.txt, calibrated on emma_ch1-4.txt), mean
# KL(fp32 || cache): int8 0.8: 0.00124, 1.0: 4.6e-5, 1.2: 2.2e-5, 1.5: 3.5e-5 -- headroom for positions and
# texts calibration did not hold (values past the range saturate); int4 0.6: 0.022, 0.7: 0.0053, 0.8: 0.0040,
# 1.0: 0.0068 -- at 7 levels a step's width costs more than clipping the rare largest values.
MARGIN = {"int8": 1.2, "int4": 0.8}
# Windows are as long as the model's context (capped), since keys grow with position embeddings the
# calibration must reach; the token budget is the recipe's calibration_sequences x calibration_length.
MAX_WINDOW = 1024
MIN_SCALE = 1e-6  # a channel that is always 0 (scale 0 would divide by zero inside the kernel)
_ONNX_TYPE = {"float16": TensorProto.FLOAT16, "int8": TensorProto.INT8, "uint8": TensorProto.UINT8}


def check_kv_cache(name: str, graph: str, half_precision: bool) -> KVCacheKind:
    """What quantize can store for this source and recipe; one line otherwise."""
    kind = kv_cache_kind(name, QuantizationError)
    if name == DEFAULT_KV_CACHE:
        return kind
    if graph != C.GRAPH_KV_BUFFER:  # a wrong command line for this dir (exit 2), as an option that does nothing
        raise InvalidArgumentError(f"--kv-cache {name} needs a kv_buffer graph (export --graph kv_buffer); "
                                f"this one is {graph}")
    if half_precision:
        raise InvalidArgumentError(f"--kv-cache {name} applies to graphs that compute in fp32; an fp16 graph's cache "
                                "is fp16 already")
    return kind


def bos_first(windows: list[list[int]], manifest: Manifest) -> list[list[int]]:
    """Each calibration window as the model sees a prompt: its first id replaced by bos where the tokenizer adds one
    (the manifest's add_bos; generate and serve put it first). Position 0 of such a model carries the bos's
    activations and keys (often the largest it has: attention sinks), so scales measured without it would clip
    them. Others: as they are."""
    if not manifest.add_bos or manifest.bos_id is None:
        return windows
    return [[manifest.bos_id, *w[1:]] for w in windows]


def calibration_ids(model_dir: Path, text: str | None, budget: int, context: int) -> list[np.ndarray]:
    """Windows (1, L) of the calibration text's ids, L = min(context, MAX_WINDOW), spread evenly, about
    `budget` tokens in all (at least one window); bos first where the tokenizer adds one (bos_first)."""
    if not text:
        raise QuantizationError("an int8 / int4 KV cache needs --calibration TEXT_FILE (its scales are measured)")
    ids = encode(load_tokenizer(model_dir), text)
    length = min(context, MAX_WINDOW, len(ids))
    if length < 2:
        raise QuantizationError(f"calibration text has {len(ids)} tokens; the KV cache scales need at least 2")
    count = max(1, min(math.ceil(budget / length), len(ids) // length))
    starts = np.linspace(0, len(ids) - length, count).astype(int)
    windows = bos_first([ids[s:s + length] for s in starts], read_manifest(model_dir))
    return [np.asarray(w, np.int64)[None] for w in windows]


def measure_absmax(model_dir: Path, windows: list[np.ndarray],
                   progress: Callable[[int, int], None] | None = None) -> list[np.ndarray]:
    """Largest |value| per (head, channel) of every present, over the windows -> [k0, v0, k1, ...] (1, nh, 1, hs)."""
    loaded = runtime.load(model_dir, device="cpu")
    amax: list[np.ndarray] | None = None
    for done, ids in enumerate(windows, 1):
        pos = np.arange(ids.shape[1], dtype=np.int64)[None]
        _, presents = loaded.forward(ids, np.ones_like(ids), pos, loaded.empty_past(1))  # (1, nh, L, hs) each
        seen = [np.abs(p).max(axis=2, keepdims=True) for p in presents]  # (1, nh, 1, hs)
        amax = seen if amax is None else [np.maximum(a, s) for a, s in zip(amax, seen, strict=True)]
        if progress:
            progress(done, len(windows))
    return amax


def scales_from_absmax(amax: list[np.ndarray], kind: KVCacheKind) -> list[np.ndarray]:
    """Symmetric scales: the margin-widened max maps to qmax. (1, nh, 1, hs) float32 each."""
    return [(np.maximum(a * MARGIN[kind.name], MIN_SCALE) / kind.qmax).astype(np.float32) for a in amax]


def _retype(value: onnx.ValueInfoProto, kind: KVCacheKind, head_dim: int) -> None:
    tensor = value.type.tensor_type
    tensor.elem_type = _ONNX_TYPE[kind.onnx_type]
    last = tensor.shape.dim[3]  # (B, nh, T, hs) -> (B, nh, T, width)
    last.Clear()
    last.dim_value = kind.width(head_dim)


def rewrite_kv_cache(model: onnx.ModelProto, kind: KVCacheKind, head_dim: int,
                     scales: list[np.ndarray] | None = None) -> int:
    """In place: every cache input/output in `kind`'s type, every GroupQueryAttention told how to store it
    -> the number of GroupQueryAttention nodes rewritten. scales: [k0, v0, k1, v1, ...] for int8 / int4."""
    g = model.graph
    inputs, layer_of = {v.name for v in g.input}, {}
    while C.past_key(len(layer_of)) in inputs:
        layer_of[C.past_key(len(layer_of))] = len(layer_of)
    names = {n for i in layer_of.values() for n in (C.past_key(i), C.past_value(i), C.present_key(i),
                                                      C.present_value(i))}
    for value in (*g.input, *g.output):
        if value.name in names:
            _retype(value, kind, head_dim)
    kept = [v for v in g.value_info if v.name not in names]  # shape inference's float records, now stale
    del g.value_info[:]
    g.value_info.extend(kept)
    rewritten = 0
    for node in g.node:
        if node.op_type != "GroupQueryAttention" or len(node.input) < 5 or node.input[3] not in layer_of:
            continue
        i = layer_of[node.input[3]]  # inputs: q, k, v, past_key, past_value, seqlens_k, total, cos, sin, ...
        rewritten += 1
        if not kind.quantized:
            continue
        # inputs 7..11 (cos_cache, sin_cache, position_ids, attention_bias, head_sink) and 16 (query_seqlens, where
        # the rotary is inside the op) keep what they are
        while len(node.input) <= C.GQA_V_SCALE:
            node.input.append("")
        for j, (suffix, index) in enumerate((("key", C.GQA_K_SCALE), ("value", C.GQA_V_SCALE))):
            name = f"kv_cache.{i}.{suffix}_scale"
            g.initializer.append(numpy_helper.from_array(scales[2 * i + j], name))
            node.input[index] = name
        node.attribute.extend([onnx.helper.make_attribute("kv_cache_bit_width", kind.bits),
                               onnx.helper.make_attribute("k_quant_type", "PER_CHANNEL"),
                               onnx.helper.make_attribute("v_quant_type", "PER_CHANNEL")])
    if rewritten != len(layer_of):
        raise QuantizationError(f"--kv-cache {kind.name}: {rewritten} GroupQueryAttention nodes read the cache of "
                                f"{len(layer_of)} layers (not a kv_buffer graph gptedge wrote?)")
    return rewritten
