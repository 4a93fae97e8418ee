"""Write a task head's graph directly from the weights: the family's blocks, then the head on the extract state.

I/O (runtime/classify.py reads the names from the manifest):

    sequence head    in  input_ids, attention_mask  int64 (B, S)       out logits     float (B, num_labels)
    multiple choice  in  input_ids, attention_mask  int64 (B, N, S)    out mc_logits  float (B, N)

Rows are right-padded; the head reads each row's state at its last attended position (the extract
token), found in the graph as transformers finds its last non-pad token: argmax(arange(S) * mask).
Positions are cumsum(mask) - 1 clipped at 0, computed in the graph. No KV cache: a classifier reads
its input once, so the graph has no past inputs nor present outputs, and no vocabulary-wide logits:
the LM head is not in it. The family's attention writers read a past; here every layer's is one
empty (R, nh, 0, hs) tensor, so the blocks are written by the same code as the LM's.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from gptedge.onnx_files import WeightSink
from gptedge.runtime import contract as C

from .config import GPTConfig
from .families import family
from .graph_attention import choose_attention
from .graph_ops import layer_norm
from .graph_writer import MS_DOMAIN, GraphWriter, Weights
from .task_heads import HeadKind

DIM_CHOICES = "num_choices"
DIM_LABELS = "num_labels"


def _flat_rows(g: GraphWriter, name: str, choice: bool) -> str:
    """input (B, S) or (B, N, S) -> rows (R, S), R = B or B * N."""
    if not choice:
        return name
    seq = g.one("Shape", [name], start=2, end=3)  # [S]
    return g.one("Reshape", [name, g.one("Concat", [g.i64([-1]), seq], axis=0)])


def _allowed(g: GraphWriter, mask: str) -> str:
    """(R, 1, S, S) bool: key j <= query i, and key j is not padding."""
    seq = g.one("Squeeze", [g.one("Shape", [mask], start=1, end=2)])  # S
    steps = g.one("Range", [g.one("Squeeze", [g.i64([0])]), seq, g.i64(1)])  # (S,)
    causal = g.one("LessOrEqual", [g.one("Unsqueeze", [steps, g.i64([0])]),  # (1, S) keys
                                   g.one("Unsqueeze", [steps, g.i64([1])])])  # (S, 1) queries -> (S, S)
    pad = g.one("Unsqueeze", [g.one("Cast", [mask], to=TensorProto.BOOL), g.i64([1, 2])])  # (R, 1, 1, S)
    return g.one("And", [causal, pad], name="attention_allowed")


def _extract_state(g: GraphWriter, h: str, mask: str) -> str:
    """h (R, S, C), mask (R, S) -> the state at each row's last attended position (R, C)."""
    seq = g.one("Squeeze", [g.one("Shape", [mask], start=1, end=2)])
    steps = g.one("Range", [g.one("Squeeze", [g.i64([0])]), seq, g.i64(1)])  # (S,)
    scored = g.one("Cast", [g.one("Mul", [mask, steps])], to=TensorProto.FLOAT)  # (R, S); exact below 2^24
    last = g.one("ArgMax", [scored], axis=1, keepdims=1, name="extract_position")  # (R, 1)
    return g.one("GatherND", [h, last], batch_dims=1, name="extract_state")  # (R, C)


def build_head_graph(cfg: GPTConfig, weights: Weights, kind: HeadKind, head_weight: np.ndarray,
                     head_bias: np.ndarray | None, activation: str | None, opset: int, fused: bool = True,
                     sink: WeightSink | None = None) -> onnx.ModelProto:
    """weights: the body's (reference parameter names); head_weight (L, C) / (1, C) and head_bias (1,) the head's."""
    fam = family(cfg.arch)
    attention = choose_attention(fam.attention_kinds(cfg), C.GRAPH_STANDARD, fused, f"{cfg.arch} ({cfg.activation})")
    choice = kind.output == "mc_logits"
    g = GraphWriter(sink)
    ids, mask = _flat_rows(g, C.INPUT_IDS, choice), _flat_rows(g, C.ATTENTION_MASK, choice)  # (R, S)
    # positions 0.. on the real tokens; named as the LM graph's input so load checks the position table the same way
    pos = g.one("Max", [g.one("Sub", [g.one("CumSum", [mask, g.i64(1)]), g.i64(1)]), g.i64(0)],
                outputs=[C.POSITION_IDS])
    wte = g.const("wte.weight", weights["wte.weight"])  # (V, C)
    wpe = g.const("wpe.weight", weights["wpe.weight"])  # (n_positions, C)
    h = g.one("Add", [g.one("Gather", [wte, ids], name="embed_tokens"),
                      g.one("Gather", [wpe, pos], name="embed_positions")])  # (R, S, C)
    empty = g.one("Transpose", [g.one("Reshape", [g.one("Slice", [h, g.i64([0]), g.i64([0]), g.i64([1])]),
                                                  g.i64([0, 0, cfg.n_head, cfg.head_dim])])],
                  perm=[0, 2, 1, 3], name="empty_past")  # (R, nh, 0, hs)
    for name in C.IONames(cfg.n_layer).past_names:
        g.one("Identity", [empty], outputs=[name])
    h = fam.write_blocks(g, h, weights, cfg, attention(g, cfg, _allowed(g, mask)))
    if fam.final_norm:
        h = layer_norm(g, h, weights, "ln_f", cfg.layer_norm_epsilon)
    x = _extract_state(g, h, mask)  # (R, C)
    # the head as a linear MatMul on a (C, L) initializer: the quantizers treat it as they treat every linear
    last = not choice and head_bias is None and activation is None  # transformers' score: the MatMul is the output
    y = g.one("MatMul", [x, g.const("head.weight", np.ascontiguousarray(head_weight.T))], name="head.MatMul",
              outputs=[kind.output] if last else None)  # (R, L)
    if head_bias is not None:
        y = g.one("Add", [y, g.const("head.bias", head_bias)], name="head.Add")
    if activation == "tanh":
        y = g.one("Tanh", [y])
    if choice:  # (B * N, 1) -> (B, N)
        g.one("Reshape", [y, g.one("Shape", [C.INPUT_IDS], start=0, end=2)], outputs=[kind.output])
    elif not last:
        g.one("Identity", [y], outputs=[kind.output])
    return _model(g, kind, head_weight.shape[0], opset, choice)


def _model(g: GraphWriter, kind: HeadKind, labels: int, opset: int, choice: bool) -> onnx.ModelProto:
    dims = [C.DIM_BATCH, DIM_CHOICES, C.DIM_SEQ] if choice else [C.DIM_BATCH, C.DIM_SEQ]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, dims) for n in (C.INPUT_IDS, C.ATTENTION_MASK)]
    out_dims = [C.DIM_BATCH, DIM_CHOICES] if choice else [C.DIM_BATCH, labels]
    outputs = [helper.make_tensor_value_info(kind.output, TensorProto.FLOAT, out_dims)]
    graph = helper.make_graph(g.nodes, f"gptedge_{kind.name}", inputs, outputs, initializer=g.initializers)
    opsets = [helper.make_opsetid("", opset)]
    if any(n.domain == MS_DOMAIN for n in g.nodes):
        opsets.append(helper.make_opsetid(MS_DOMAIN, 1))
    model = helper.make_model(graph, opset_imports=opsets, producer_name="gptedge")
    model.ir_version = min(model.ir_version, 9)
    return model
