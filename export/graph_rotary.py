"""Graph pieces of the rotary families (llama.py): RMSNorm, rotary positions, grouped-query attention.

Two attention writers, one per graph variant, called per layer as graph_attention.py's are:

- RotaryPlainAttention (standard graph): plain ONNX ops, the reference's computation. q and k rotated
  with the cos/sin rows of position_ids, the cache concatenated, kv heads repeated for their query
  heads (grouped-query attention), masked scores replaced, softmax, PV.
- RotaryGroupQueryAttention (kv_buffer graph): GroupQueryAttention with kv_num_heads < num_heads over the
  shared buffer, q and k rotated at the caller's position_ids (each row's own position, cumsum(mask) - 1 for a
  left-padded row), so the cache holds what the reference's does, byte for byte comparable (rung 3), and a
  row's cached keys stay right wherever a pool copies them. Two forms, one computation:
  * inside (`rotary_inside`): the packed q | k | v projection straight into GroupQueryAttention with
    do_rotary=1, position_ids and query_seqlens (ONNX Runtime >= 1.32). Without query_seqlens the op rotates a
    first prompt at position_ids[0, 0] + s for every row, not at each row's own positions (measured on 1.32);
    with it every row's position_ids are honoured, the prompt's included. query_seqlens = min(S, seqlens_k + 1)
    is the value the op assumes without it. One node a layer instead of Split + two RotaryEmbedding + the
    attention: 1.05-1.10x a decode step on the SmolLM2-135M shape (see
    docs/design.md#the-onnx-io-contract). The op's rotary wants head_size and rotary_dim multiples of 16; its
    cos / sin tables at least as many rows as the mask is wide (2 n_positions here, see __init__).
  * outside: RotaryEmbedding on q and k, then the attention, for every other graph (older ONNX Runtime, other
    head sizes), and what quantize's fp16 targets rewrite an inside graph back to (quantize/rotary_form.py:
    the CUDA provider's attention is checked in that form).

Projection weights are stored [in, out] (the MatMul's layout; transformers' Linear stores [out, in]).
A family names its projections through `packed_qkv` / `output`: one packed q | k | v linear (Llama's q_proj,
k_proj, v_proj concatenated at export: `h.N.self_attn.qkv_proj`) split after the MatMul, and o_proj.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
from onnx import TensorProto

from gptedge.runtime import contract as C
from gptedge.runtime.graphs.session import gqa_takes_query_seqlens

from .graph_writer import Weights
from .config import GPTConfig
from .graph_attention import AttentionWriter, GroupQueryAttention
from .graph_writer import FLOAT_MIN, MS_DOMAIN, GraphWriter
from .rotary import inv_freq, tables


def rotary_inside(cfg: GPTConfig) -> bool:
    """The kv_buffer graph rotates inside GroupQueryAttention (module docstring): the installed ONNX Runtime takes
    query_seqlens, and the op's rotary takes this head (head_size % 16, cos_cache's width rotary_dim / 2 % 8)."""
    return cfg.head_dim % 16 == 0 and cfg.rotary_dim % 16 == 0 and gqa_takes_query_seqlens()


def dense(g: GraphWriter, x: str, w: Weights, prefix: str) -> str:
    """x @ W.T [+ b] for a transformers Linear (W [out, in]); the bias where the weights have one."""
    weight = np.ascontiguousarray(w[f"{prefix}.weight"].T)  # [in, out]
    y = g.one("MatMul", [x, g.const(f"{prefix}.weight", weight)], name=f"{prefix}.MatMul")
    if f"{prefix}.bias" not in w:
        return y
    return g.one("Add", [y, g.const(f"{prefix}.bias", w[f"{prefix}.bias"])], name=f"{prefix}.Add")


def rms_norm(g: GraphWriter, x: str, w: Weights, prefix: str, eps: float) -> str:
    """weight * x / sqrt(mean(x^2) + eps) over the last axis. In a contrib graph (kv_buffer) ONNX Runtime's
    SimplifiedLayerNormalization (its schema, in the ONNX domain), one node; in a plain one six standard ops (opset
    17 has no RMSNormalization), the shape ONNX Runtime's optimizer fuses into that node at session creation."""
    gamma = g.const(f"{prefix}.weight", w[f"{prefix}.weight"])
    if g.contrib:
        return g.one("SimplifiedLayerNormalization", [x, gamma], name=prefix, axis=-1, epsilon=eps)
    squares = g.one("Pow", [x, g.f32(2.0)])
    if g.opset >= 18:  # axes became an input
        ms = g.one("ReduceMean", [squares, g.i64([-1])], keepdims=1)
    else:
        ms = g.one("ReduceMean", [squares], axes=[-1], keepdims=1)
    y = g.one("Div", [x, g.one("Sqrt", [g.one("Add", [ms, g.f32(eps)])])])
    return g.one("Mul", [gamma, y], name=prefix)


def residual_rms_norm(g: GraphWriter, x: str, skip: str, w: Weights, prefix: str, eps: float,
                      name: str) -> tuple[str, str]:
    """A residual add and the RMSNorm after it: x, skip (B, S, C) -> (rms_norm(x + skip), x + skip). In a contrib
    graph one com.microsoft SkipSimplifiedLayerNormalization, whose fourth output is the sum itself (the next
    residual reads it; its mean and inverse-deviation outputs are left unwritten); in a plain one an Add (`name`)
    and rms_norm."""
    if not g.contrib:
        total = g.one("Add", [skip, x], name=name)
        return rms_norm(g, total, w, prefix, eps), total
    normed, _, _, total = g.op("SkipSimplifiedLayerNormalization",
                               [x, skip, g.const(f"{prefix}.weight", w[f"{prefix}.weight"])], name=prefix,
                               outputs=[f"{prefix}_out", "", "", f"{name}_out"], domain=MS_DOMAIN, epsilon=eps)
    return normed, total


class _Rotary:
    """What both writers share: the cos/sin caches (n_positions, r / 2), stored once, and the projections."""

    rotary_dim: int
    n_kv: int

    def _rotary_setup(self, g: GraphWriter, cfg: GPTConfig, rows: int | None = None) -> None:
        """rows: the tables' rows, n_positions unless the attention asks for more (RotaryGroupQueryAttention)."""
        self.rotary_dim = cfg.rotary_dim
        self.n_kv = cfg.kv_heads
        cos, sin = tables(inv_freq(cfg.rotary_dim, cfg.rope_theta, cfg.rope_scaling), rows or cfg.n_positions)
        self.cos_cache = g.const("rotary.cos_cache", cos)
        self.sin_cache = g.const("rotary.sin_cache", sin)

    def project(self, g: GraphWriter, x: str, w: Weights, i: int) -> tuple[str, str, str]:
        """x (B, S, C) -> q (B, S, nh * hs), k and v (B, S, nkv * hs): one packed q | k | v linear (one MatMul, one
        kernel dispatch a step instead of three), then a Split."""
        y = dense(g, x, self.packed_qkv(w, i), self.qkv_name(i))  # (B, S, (nh + 2 nkv) hs)
        sizes = [self.n_head * self.head_dim] + [self.n_kv * self.head_dim] * 2
        q, k, v = g.op("Split", [y, g.i64(sizes)], n_out=3, name=f"{self.qkv_name(i)}.Split", axis=-1)
        return q, k, v

    def qkv_name(self, i: int) -> str:
        """The packed projection's name in the graph (its weight `NAME.weight`, the name quantize matches)."""
        return f"h.{i}.self_attn.qkv_proj"

    def packed_qkv(self, w: Weights, i: int) -> Weights:
        """Llama's q_proj, k_proj, v_proj (each [out, in]) stacked along out: {NAME.weight [(nh + 2 nkv) hs, C],
        NAME.bias where they have biases (Qwen2)}."""
        p, name = f"h.{i}.self_attn", self.qkv_name(i)
        packed = {f"{name}.weight": np.concatenate([w[f"{p}.{n}_proj.weight"] for n in "qkv"], axis=0)}
        if f"{p}.q_proj.bias" in w:
            packed[f"{name}.bias"] = np.concatenate([w[f"{p}.{n}_proj.bias"] for n in "qkv"], axis=0)
        return packed

    def output(self, g: GraphWriter, y: str, w: Weights, i: int) -> str:
        return dense(g, y, w, f"h.{i}.self_attn.o_proj")


class RotaryPlainAttention(_Rotary, AttentionWriter):
    graphs = frozenset({C.GRAPH_STANDARD})
    contrib = False

    def __init__(self, g: GraphWriter, cfg: GPTConfig, allowed: str):
        super().__init__(g, cfg, allowed)
        self.allowed = allowed
        self._rotary_setup(g, cfg)
        # (B, 1, S, r / 2): each position's row, shared by every layer
        self.cos = g.one("Unsqueeze", [g.one("Gather", [self.cos_cache, C.POSITION_IDS]), g.i64([1])],
                         name="rotary.cos")
        self.sin = g.one("Unsqueeze", [g.one("Gather", [self.sin_cache, C.POSITION_IDS]), g.i64([1])],
                         name="rotary.sin")

    def _heads(self, t: str, n: int) -> str:
        g = self.g
        return g.one("Transpose", [g.one("Reshape", [t, g.i64([0, 0, n, self.head_dim])])], perm=[0, 2, 1, 3])

    def _rotate(self, x: str) -> str:
        """x (B, n, S, hs) -> its first rotary_dim channels rotated half against half (rotary.rotate)."""
        g, half = self.g, self.rotary_dim // 2
        sizes = [half, half] + ([self.head_dim - self.rotary_dim] if self.rotary_dim < self.head_dim else [])
        parts = g.op("Split", [x, g.i64(sizes)], n_out=len(sizes), axis=-1)
        x1, x2 = parts[0], parts[1]
        first = g.one("Sub", [g.one("Mul", [x1, self.cos]), g.one("Mul", [x2, self.sin])])
        second = g.one("Add", [g.one("Mul", [x2, self.cos]), g.one("Mul", [x1, self.sin])])
        return g.one("Concat", [first, second, *parts[2:]], axis=-1)

    def _repeat(self, t: str) -> str:
        """(B, nkv, T, hs) -> (B, nh, T, hs): kv head j serves query heads j * rep .. j * rep + rep - 1."""
        rep = self.n_head // self.n_kv
        if rep == 1:
            return t
        g = self.g
        grown = g.one("Expand", [g.one("Unsqueeze", [t, g.i64([2])]), g.i64([1, 1, rep, 1, 1])])  # (B, nkv, rep, T, hs)
        return g.one("Reshape", [grown, g.i64([0, self.n_head, -1, self.head_dim])])

    def __call__(self, x: str, w: Weights, i: int) -> str:
        g, p = self.g, f"h.{i}.attn"
        q, k, v = self.project(g, x, w, i)
        q = self._rotate(self._heads(q, self.n_head))  # (B, nh, S, hs)
        k = self._rotate(self._heads(k, self.n_kv))  # (B, nkv, S, hs)
        present_k = g.one("Concat", [C.past_key(i), k], name=f"{p}.concat_key", outputs=[C.present_key(i)], axis=2)
        present_v = g.one("Concat", [C.past_value(i), self._heads(v, self.n_kv)], name=f"{p}.concat_value",
                          outputs=[C.present_value(i)], axis=2)  # (B, nkv, T, hs)
        kt = g.one("Transpose", [self._repeat(present_k)], perm=[0, 1, 3, 2])  # (B, nh, hs, T)
        scores = g.one("Div", [g.one("MatMul", [q, kt], name=f"{p}.qk"), g.f32(math.sqrt(self.head_dim))])
        scores = g.one("Where", [self.allowed, scores, g.f32(FLOAT_MIN)])  # (B, nh, S, T)
        y = g.one("MatMul", [g.one("Softmax", [scores], axis=-1), self._repeat(present_v)], name=f"{p}.pv")
        y = g.one("Reshape", [g.one("Transpose", [y], perm=[0, 2, 1, 3]), g.i64([0, 0, self.n_head * self.head_dim])])
        return self.output(g, y, w, i)


class RotaryGroupQueryAttention(_Rotary, GroupQueryAttention):
    """GroupQueryAttention's buffer, timeline and padding bias (graph_attention.py) with kv_num_heads = the
    config's kv_heads, q and k rotated at the caller's position_ids, inside the op or before it (see above)."""

    graphs: ClassVar[frozenset[str]] = frozenset({C.GRAPH_KV_BUFFER})
    contrib = True

    def __init__(self, g: GraphWriter, cfg: GPTConfig, allowed: str):
        super().__init__(g, cfg, allowed)
        self.inside = rotary_inside(cfg)
        # Inside, GroupQueryAttention wants cos_cache rows >= total_sequence_length, the mask's width, not the
        # largest position: a left-padded batch whose short rows decode past the longest prompt's room (generate
        # lets them, up to context - shortest prompt) has a mask up to 2 n_positions - 1 wide, every position in it
        # below n_positions.
        self._rotary_setup(g, cfg, 2 * cfg.n_positions if self.inside else None)
        self._query_seqlens: str | None = None

    def _rotate(self, t: str, heads: int, name: str) -> str:
        g = self.g
        partial = {} if self.rotary_dim == self.head_dim else {"rotary_embedding_dim": self.rotary_dim,
                                                               "num_heads": heads}
        return g.one("RotaryEmbedding", [t, C.POSITION_IDS, self.cos_cache, self.sin_cache], name=name,
                     domain=MS_DOMAIN, interleaved=0, **partial)

    def query_seqlens(self, x: str) -> str:
        """(B,) int32 min(S, seqlens_k + 1), written once for every layer: the op's default for the input, given
        so that a prompt's rows are rotated at their own position_ids. x: (B, S, C)."""
        if self._query_seqlens is None:
            g = self.g
            s = g.one("Cast", [g.one("Shape", [x], start=1, end=2)], to=TensorProto.INT32)  # [S]
            held = g.one("Add", [self.seqlens_k, g.constant(np.array([1], np.int32))])  # (B,) T
            self._query_seqlens = g.one("Min", [held, s], name="gqa.query_seqlens")
        return self._query_seqlens

    def __call__(self, x: str, w: Weights, i: int) -> str:
        g, p = self.g, f"h.{i}.attn"
        heads = dict(num_heads=self.n_head, kv_num_heads=self.n_kv)
        outputs = [f"{p}.out", C.present_key(i), C.present_value(i)]
        if self.inside:
            packed = dense(g, x, self.packed_qkv(w, i), self.qkv_name(i))  # (B, S, (nh + 2 nkv) hs)
            inputs = [packed, "", "", C.past_key(i), C.past_value(i), self.seqlens_k, self.total] + [""] * 10
            inputs[C.GQA_COS_CACHE], inputs[C.GQA_SIN_CACHE] = self.cos_cache, self.sin_cache
            inputs[C.GQA_POSITION_IDS], inputs[C.GQA_ATTENTION_BIAS] = C.POSITION_IDS, self.bias
            inputs[C.GQA_QUERY_SEQLENS] = self.query_seqlens(x)
            y = g.op("GroupQueryAttention", inputs, outputs=outputs, name=f"{p}.gqa", domain=MS_DOMAIN,
                     do_rotary=1, rotary_interleaved=0, **heads)[0]  # (B, S, nh * hs)
            return self.output(g, y, w, i)
        q, k, v = self.project(g, x, w, i)
        q = self._rotate(q, self.n_head, f"{p}.rotary_q")
        k = self._rotate(k, self.n_kv, f"{p}.rotary_k")
        y = g.op("GroupQueryAttention", [q, k, v, C.past_key(i), C.past_value(i), self.seqlens_k, self.total,
                                         "", "", "", self.bias],
                 outputs=outputs, name=f"{p}.gqa", domain=MS_DOMAIN, **heads)[0]  # (B, S, nh * hs)
        return self.output(g, y, w, i)
