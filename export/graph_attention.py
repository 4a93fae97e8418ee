"""Attention as a parameter of a family's graph writer: plain ops, MultiHeadAttention, GroupQueryAttention.

Each writer is built once per graph (it writes the mask tensors all layers share) and then
called per layer: `attention(x, weights, i)` -> the attention block's output after c_proj
(B, S, C), with present.{i}.key/value written as graph outputs. `graphs` says which graph
variants' caches it can write; `contrib` that it needs ONNX Runtime's contrib ops.
"""

from __future__ import annotations

from typing import ClassVar

import math

from onnx import TensorProto

from gptedge.runtime import contract as C

from .config import GPTConfig
from .graph_ops import linear
from .graph_writer import FLOAT_MIN, MS_DOMAIN, GraphWriter, Weights


class AttentionWriter:
    graphs: ClassVar[frozenset[str]]  # graph variants (contract.GRAPH_*) whose KV cache it writes
    contrib: ClassVar[bool]  # written with ONNX Runtime contrib ops

    def __init__(self, g: GraphWriter, cfg: GPTConfig, allowed: str):
        """allowed: (B, 1, S, T) bool, causal and not padding (onnx_graph._allowed_mask)."""
        self.g, self.n_head, self.head_dim, self.n_embd = g, cfg.n_head, cfg.head_dim, cfg.n_embd

    def __call__(self, x: str, w: Weights, i: int) -> str:
        raise NotImplementedError

    def _qkv(self, x: str, w: Weights, i: int, bias: bool = True) -> list[str]:
        """x (B, S, C) -> q, k, v (B, S, C) each, from one QKV MatMul."""
        qkv = linear(self.g, x, w, f"h.{i}.attn.c_attn", bias=bias)  # (B, S, 3C)
        return self.g.op("Split", [qkv, self.g.i64([self.n_embd] * 3)], n_out=3, name=f"h.{i}.attn.Split", axis=2)


class PlainAttention(AttentionWriter):
    """Standard ONNX ops, the reference's computation: concat the cache, QK^T, replace masked scores, softmax, PV."""

    graphs = frozenset({C.GRAPH_STANDARD})
    contrib = False

    def __init__(self, g: GraphWriter, cfg: GPTConfig, allowed: str):
        super().__init__(g, cfg, allowed)
        self.allowed = allowed

    def __call__(self, x: str, w: Weights, i: int) -> str:
        g, p = self.g, f"h.{i}.attn"
        heads = [g.one("Transpose", [g.one("Reshape", [t, g.i64([0, 0, self.n_head, self.head_dim])])],
                       perm=[0, 2, 1, 3]) for t in self._qkv(x, w, i)]  # q, k, v (B, nh, S, hs)
        present_k = g.one("Concat", [C.past_key(i), heads[1]], name=f"{p}.concat_key", outputs=[C.present_key(i)],
                          axis=2)
        present_v = g.one("Concat", [C.past_value(i), heads[2]], name=f"{p}.concat_value",
                          outputs=[C.present_value(i)], axis=2)  # (B, nh, T, hs)
        kt = g.one("Transpose", [present_k], perm=[0, 1, 3, 2])  # (B, nh, hs, T)
        scores = g.one("Div", [g.one("MatMul", [heads[0], kt], name=f"{p}.qk"), g.f32(math.sqrt(self.head_dim))])
        scores = g.one("Where", [self.allowed, scores, g.f32(FLOAT_MIN)])  # (B, nh, S, T), replaced as in the reference
        y = g.one("MatMul", [g.one("Softmax", [scores], axis=-1), present_v], name=f"{p}.pv")  # (B, nh, S, hs)
        y = g.one("Reshape", [g.one("Transpose", [y], perm=[0, 2, 1, 3]), g.i64([0, 0, self.n_embd])])  # (B, S, C)
        return linear(g, y, w, f"{p}.c_proj")


def _additive_bias(g: GraphWriter, allowed: str) -> str:
    """(B, 1, S, T): 0 where allowed, float min elsewhere. Adding a score to float min rounds back to
    float min, so this equals the reference's replacement, fully masked padding rows included."""
    return g.one("Where", [allowed, g.f32(0.0), g.f32(FLOAT_MIN)], name="attention_bias")


class MultiHeadAttention(AttentionWriter):
    """com.microsoft MultiHeadAttention: QKV bias, QK^T, mask, softmax, PV and the cache append in one op."""

    graphs = frozenset({C.GRAPH_STANDARD})
    contrib = True

    def __init__(self, g: GraphWriter, cfg: GPTConfig, allowed: str):
        super().__init__(g, cfg, allowed)
        self.bias = _additive_bias(g, allowed)

    def __call__(self, x: str, w: Weights, i: int) -> str:
        g, p = self.g, f"h.{i}.attn"
        q, k, v = self._qkv(x, w, i, bias=False)  # the QKV bias goes into MultiHeadAttention
        y = g.op("MultiHeadAttention", [q, k, v, g.const(f"{p}.c_attn.bias", w[f"{p}.c_attn.bias"]), "", self.bias,
                                        C.past_key(i), C.past_value(i)],
                 outputs=[f"{p}.out", C.present_key(i), C.present_value(i)], name=f"{p}.mha", domain=MS_DOMAIN,
                 num_heads=self.n_head)[0]  # (B, S, C)
        return linear(g, y, w, f"{p}.c_proj")


def timeline_lengths(g: GraphWriter) -> str:
    """(B,) int64: the positions each row holds after this run, read from the mask's content, not its width: one
    past the last column where the row has a 1 (at least 1). For a left-padded batch (generate, the CPU's shared
    timeline) every row ends at the mask's last column, so this is the width T for all rows. A wider mask (zeros on
    the right) is what a captured CUDA graph binds, one fixed (B, context) buffer for every step, and rows of
    different lengths each starting at position 0 are what the GPU's slot pool keeps (docs/design.md#cuda-graphs).
    Written from constants and the mask alone: a host-side shape feeding it would need a copy to the GPU, and a
    graph with copies cannot be captured."""
    width = g.one("Shape", [C.ATTENTION_MASK], start=1, end=2)  # [W]
    columns = g.one("Range", [g.one("Squeeze", [g.i64([1])]), g.one("Squeeze", [g.one("Add", [width, g.i64([1])])]),
                              g.one("Squeeze", [g.i64([1])])])  # (W,) 1..W
    marked = g.one("Mul", [C.ATTENTION_MASK, columns])  # (B, W): column index + 1 where the mask is 1
    if g.opset >= 18:  # axes became an input
        last = g.one("ReduceMax", [marked, g.i64([1])], keepdims=0, name="timeline_last")  # (B,)
    else:
        last = g.one("ReduceMax", [marked], axes=[1], keepdims=0, name="timeline_last")  # (B,)
    return g.one("Max", [last, g.i64([1])], name="timeline_lengths")  # (B,)


class GroupQueryAttention(AttentionWriter):
    """com.microsoft GroupQueryAttention over a KV buffer (B, nh, max_len, hs) that past and present share:
    the new keys/values are written in place, nothing is copied. Padding is masked by the additive bias,
    so every row of a left-padded batch counts its padding as positions (seqlens_k = T - 1 for all rows). The
    mask may be wider than the positions held (see timeline_lengths): total_sequence_length is its width W, the
    bias (B, 1, S, W) masks the columns past each row's end, and GroupQueryAttention reads positions
    < seqlens_k + 1 of each row only."""

    graphs = frozenset({C.GRAPH_KV_BUFFER})
    contrib = True

    def __init__(self, g: GraphWriter, cfg: GPTConfig, allowed: str):
        super().__init__(g, cfg, allowed)
        self.bias = _additive_bias(g, allowed)
        lengths = timeline_lengths(g)  # (B,)
        width = g.one("Shape", [C.ATTENTION_MASK], start=1, end=2)  # [W]
        # seqlens_k (B,) int32 = each row's length - 1 (computed on the provider's device; the new position is
        # written there), and total_sequence_length (scalar int32) = W, a shape ONNX Runtime reads on the host
        self.seqlens_k = g.one("Cast", [g.one("Sub", [lengths, g.i64([1])])], to=TensorProto.INT32)
        self.total = g.one("Cast", [g.one("Squeeze", [width])], to=TensorProto.INT32)

    def __call__(self, x: str, w: Weights, i: int) -> str:
        g, p = self.g, f"h.{i}.attn"
        # The packed q | k | v (B, S, 3C) straight in, key and value left out: the op splits it as it reads it, one
        # node and one copy of the activations fewer a layer than a Split (the Llama-style graphs' form too).
        qkv = linear(g, x, w, f"{p}.c_attn")
        y = g.op("GroupQueryAttention", [qkv, "", "", C.past_key(i), C.past_value(i), self.seqlens_k, self.total,
                                         "", "", "", self.bias],
                 outputs=[f"{p}.out", C.present_key(i), C.present_value(i)], name=f"{p}.gqa", domain=MS_DOMAIN,
                 num_heads=self.n_head, kv_num_heads=self.n_head)[0]  # (B, S, C)
        return linear(g, y, w, f"{p}.c_proj")


def choose_attention(supported: tuple[type[AttentionWriter], ...], graph: str, fused: bool,
                     model: str) -> type[AttentionWriter]:
    """The one place the attention kind is decided. The graph variant is a requirement (its cache needs a
    writer that can fill it: raises when the family has none for this config); `fused` is a preference
    (contrib ops where the family writes them, plain ops otherwise). model: for the message."""
    fits = [a for a in supported if graph in a.graphs]
    plain = [a for a in fits if not a.contrib]
    if not fits:
        needed = " or ".join(a.__name__ for a in _ALL if graph in a.graphs)
        written = ", ".join(a.__name__ for a in supported)
        raise ValueError(f"the {graph} graph needs {needed}; {model} is written with {written} only")
    if not fused and not plain:
        raise ValueError(f"the {graph} graph needs ONNX Runtime's contrib ops ({fits[0].__name__}); drop plain ops")
    return next((a for a in fits if a.contrib), fits[0]) if fused else plain[0]


_ALL = (PlainAttention, MultiHeadAttention, GroupQueryAttention)
