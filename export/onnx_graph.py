"""Write an fp32 graph (docs/design.md#the-onnx-io-contract) directly from the reference's weights: standard or
kv_buffer.

No tracing: the family writes its blocks (families.py) with the attention the graph variant
and `fused` call for (graph_attention.choose_attention); this file writes what all families
share: the causal/padding mask, the embeddings, logits_to_keep, the tied LM head and the I/O
contract. The reference GPT is the parity oracle for what is written (export/validate.py).
"""

from __future__ import annotations

import logging

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

log = logging.getLogger(__name__)

DEFAULT_OPSET = 17  # first opset with LayerNormalization


def _allowed_mask(g: GraphWriter) -> str:
    """(B, 1, S, T) bool: causal (query at absolute position P + s) and not padding."""
    seq = g.one("Shape", [C.INPUT_IDS], start=1, end=2)  # [S]
    total = g.one("Shape", [C.ATTENTION_MASK], start=1, end=2)  # [T]
    past = g.one("Sub", [total, seq])
    scalar = lambda t: g.one("Squeeze", [t])  # noqa: E731 - a one-line local helper
    q_pos = g.one("Unsqueeze", [g.one("Range", [scalar(past), scalar(total), g.i64(1)]), g.i64([1])])  # (S, 1)
    k_pos = g.one("Range", [g.one("Squeeze", [g.i64([0])]), scalar(total), g.i64(1)])  # (T,)
    causal = g.one("LessOrEqual", [k_pos, q_pos])  # (S, T)
    pad = g.one("Unsqueeze", [g.one("Cast", [C.ATTENTION_MASK], to=TensorProto.BOOL), g.i64([1, 2])])  # (B,1,1,T)
    return g.one("And", [causal, pad], name="attention_allowed")


def _keep_last_positions(g: GraphWriter, h: str) -> str:
    """h (B, S, C) -> (B, K, C): the last K = logits_to_keep positions, or all S when it is 0."""
    seq = g.one("Shape", [h], start=1, end=2)  # [S]
    keep = g.one("Reshape", [C.LOGITS_TO_KEEP, g.i64([1])])  # [K]
    zero = g.i64([0])
    start = g.one("Where", [g.one("Greater", [keep, zero]), g.one("Max", [g.one("Sub", [seq, keep]), zero]), zero])
    return g.one("Slice", [h, start, seq, g.i64([1])], name="keep_last_positions")


def build_graph(cfg: GPTConfig, weights: Weights, opset: int = DEFAULT_OPSET, fused: bool = True,
                graph: str = C.GRAPH_STANDARD, sink: WeightSink | None = None) -> onnx.ModelProto:
    """weights: the reference GPT's state dict as float32 numpy arrays (reference parameter names).

    fused: ONNX Runtime's attention and FastGelu contrib ops (fewer, larger kernels per layer) where
    the family writes them for this config, plain ONNX ops otherwise. graph: "standard" (Optimum's
    contract) or "kv_buffer" (past and present are one preallocated buffer the runtime binds to
    both, updated in place by GroupQueryAttention); raises ValueError where the family cannot.
    sink: where initializers go (default inline; export passes one that streams big models'
    weights to the external-data file as the graph is written)."""
    fam = family(cfg.arch)
    attention = choose_attention(fam.attention_kinds(cfg), graph, fused, f"{cfg.arch} ({cfg.activation})")
    log.info("%s graph: %s blocks, %s", graph, cfg.arch, attention.__name__)
    g = GraphWriter(sink, opset, contrib=attention.contrib)
    g.const(C.LOGITS_TO_KEEP, np.array(0, dtype=np.int64))  # the optional input's default (see _model)
    wte = g.const("wte.weight", weights["wte.weight"])  # (V, C): stored once, used by Gather and the LM head
    allowed = _allowed_mask(g)
    h = g.one("Gather", [wte, C.INPUT_IDS], name="embed_tokens")  # (B, S, C)
    if fam.embedding_scale is not None:  # after the Gather: the tied head reads the table unscaled
        h = g.one("Mul", [h, g.const("wte.scale", np.array(fam.embedding_scale(cfg), dtype=np.float32))],
                  name="embed_scale")
    if fam.positions == "learned":  # rotary families rotate q and k inside their attention instead
        wpe = g.const("wpe.weight", weights["wpe.weight"])  # (n_positions, C)
        h = g.one("Add", [h, g.one("Gather", [wpe, C.POSITION_IDS], name="embed_positions")])
    h = fam.write_blocks(g, h, weights, cfg, attention(g, cfg, allowed))
    if fam.final_norm:
        h = (fam.write_norm(g, h, weights, "ln_f", cfg) if fam.write_norm
             else layer_norm(g, h, weights, "ln_f", cfg.layer_norm_epsilon))
    h = _keep_last_positions(g, h)  # (B, K, C)
    # Gemm with transB reads a (V, C) head as is: the tied one is wte itself, stored once.
    head = wte if cfg.tied_head else g.const("lm_head.weight", weights["lm_head.weight"])
    rows = g.one("Gemm", [g.one("Reshape", [h, g.i64([-1, cfg.n_embd])]), head], name="lm_head", transB=1)  # (B*K, V)
    out_shape = g.one("Concat", [g.one("Shape", [h], start=0, end=2), g.i64([cfg.vocab_size])], axis=0)
    g.one("Reshape", [rows, out_shape], outputs=[C.LOGITS], name="logits_reshape")
    return _model(g, cfg, opset, graph == C.GRAPH_KV_BUFFER)


def _model(g: GraphWriter, cfg: GPTConfig, opset: int, kv_buffer: bool = False) -> onnx.ModelProto:
    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    kv = [C.DIM_BATCH, cfg.kv_heads, C.DIM_BUFFER if kv_buffer else C.DIM_PAST, cfg.head_dim]
    kv_out = [C.DIM_BATCH, cfg.kv_heads, C.DIM_BUFFER if kv_buffer else C.DIM_TOTAL, cfg.head_dim]
    inputs = [helper.make_tensor_value_info(C.INPUT_IDS, i64, [C.DIM_BATCH, C.DIM_SEQ]),
              helper.make_tensor_value_info(C.ATTENTION_MASK, i64, [C.DIM_BATCH, C.DIM_TOTAL]),
              helper.make_tensor_value_info(C.POSITION_IDS, i64, [C.DIM_BATCH, C.DIM_SEQ])]
    inputs += [helper.make_tensor_value_info(n, f32, kv) for n in C.IONames(cfg.n_layer).past_names]
    # logits_to_keep: in both graphs an input and an initializer (an optional input, default 0), so callers
    # that do not know it (ONNX Runtime GenAI, Optimum) leave it unfed; gptedge's runtime feeds 1 to decode.
    inputs.append(helper.make_tensor_value_info(C.LOGITS_TO_KEEP, i64, []))
    outputs = [helper.make_tensor_value_info(C.LOGITS, f32, [C.DIM_BATCH, C.DIM_LOGITS, cfg.vocab_size])]
    outputs += [helper.make_tensor_value_info(n, f32, kv_out) for n in C.IONames(cfg.n_layer).present_names]
    name = f"gptedge_{C.GRAPH_KV_BUFFER if kv_buffer else C.GRAPH_STANDARD}"
    graph = helper.make_graph(g.nodes, name, inputs, outputs, initializer=g.initializers)
    opsets = [helper.make_opsetid("", opset)]
    if any(n.domain == MS_DOMAIN for n in g.nodes):
        opsets.append(helper.make_opsetid(MS_DOMAIN, 1))
    model = helper.make_model(graph, opset_imports=opsets, producer_name="gptedge")
    model.ir_version = min(model.ir_version, 9)  # readable by ONNX Runtime releases of the last two years
    return model
