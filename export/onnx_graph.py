"""Write the "standard" fp32 graph (DESIGN §3) directly from the reference's weights.

No tracing: a handful of plain ONNX ops per layer, in shapes ONNX Runtime's optimizer fuses
(LayerNormalization, a GELU it turns into FastGelu/Gelu, one MatMul for QKV). The reference
GPT is the parity oracle for what is written here (export/validate.py).
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from gptedge.runtime import contract as C

from .config import GPTConfig

DEFAULT_OPSET = 17  # first opset with LayerNormalization
MS_DOMAIN = "com.microsoft"  # ONNX Runtime's contrib ops
FLOAT_MIN = float(np.finfo(np.float32).min)


class GraphWriter:
    """Collects nodes and initializers with unique names."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, name: str | None = None,
           outputs: list[str] | None = None, domain: str = "", **attrs) -> list[str]:
        self._count += 1
        base = name or f"{op_type.lower()}_{self._count}"
        outputs = outputs or [f"{base}_out{i}" if n_out > 1 else f"{base}_out" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=base, domain=domain, **attrs))
        return outputs

    def one(self, op_type: str, inputs: list[str], **kw) -> str:
        return self.op(op_type, inputs, **kw)[0]

    def const(self, name: str, value: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.require(value, requirements="C"), name))
        return name


def _linear(g: GraphWriter, x: str, w: dict[str, np.ndarray], prefix: str, bias: bool = True) -> str:
    """x (B, S, in) @ W (in, out) [+ b]; without the bias, a fused op downstream adds it."""
    y = g.one("MatMul", [x, g.const(f"{prefix}.weight", w[f"{prefix}.weight"])], name=f"{prefix}.MatMul")
    if not bias:
        return y
    return g.one("Add", [y, g.const(f"{prefix}.bias", w[f"{prefix}.bias"])], name=f"{prefix}.Add")


def _layer_norm(g: GraphWriter, x: str, w: dict[str, np.ndarray], prefix: str, eps: float) -> str:
    return g.one("LayerNormalization", [x, g.const(f"{prefix}.weight", w[f"{prefix}.weight"]),
                                        g.const(f"{prefix}.bias", w[f"{prefix}.bias"])],
                 name=prefix, axis=-1, epsilon=eps)


def _activation(g: GraphWriter, x: str, kind: str) -> str:
    if kind == "relu":
        return g.one("Relu", [x])
    if kind == "gelu_erf":  # 0.5 x (1 + erf(x / sqrt 2)); ORT fuses this into Gelu
        e = g.one("Erf", [g.one("Div", [x, "const_sqrt2"])])
        return g.one("Mul", [g.one("Mul", [x, g.one("Add", [e, "const_one"])]), "const_half"])
    # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); ORT fuses this into FastGelu
    x3 = g.one("Mul", [g.one("Mul", [x, x]), x])
    inner = g.one("Mul", [g.one("Add", [x, g.one("Mul", [x3, "const_gelu_coef"])]), "const_sqrt_2_over_pi"])
    return g.one("Mul", [g.one("Mul", [x, g.one("Add", [g.one("Tanh", [inner]), "const_one"])]), "const_half"])


def _attention(g: GraphWriter, x: str, allowed: str, w: dict[str, np.ndarray], cfg: GPTConfig, i: int,
               proj_bias: bool = True) -> str:
    p = f"h.{i}.attn"
    qkv = _linear(g, x, w, f"{p}.c_attn")  # (B, S, 3C)
    q, k, v = g.op("Split", [qkv, "const_qkv_split"], n_out=3, name=f"{p}.Split", axis=2)  # (B, S, C) each
    heads = [g.one("Transpose", [g.one("Reshape", [t, "const_shape_heads"])], perm=[0, 2, 1, 3])
             for t in (q, k, v)]  # (B, nh, S, hs)
    present_k = g.one("Concat", [C.past_key(i), heads[1]], name=f"{p}.concat_key", outputs=[C.present_key(i)], axis=2)
    present_v = g.one("Concat", [C.past_value(i), heads[2]], name=f"{p}.concat_value", outputs=[C.present_value(i)], axis=2)
    kt = g.one("Transpose", [present_k], perm=[0, 1, 3, 2])  # (B, nh, hs, T)
    scores = g.one("Div", [g.one("MatMul", [heads[0], kt], name=f"{p}.qk"), "const_sqrt_head_dim"])  # (B, nh, S, T)
    scores = g.one("Where", [allowed, scores, "const_float_min"])  # masked scores replaced, as in the reference
    probs = g.one("Softmax", [scores], axis=-1)
    y = g.one("MatMul", [probs, present_v], name=f"{p}.pv")  # (B, nh, S, hs)
    y = g.one("Reshape", [g.one("Transpose", [y], perm=[0, 2, 1, 3]), "const_shape_merge"])  # (B, S, C)
    return _linear(g, y, w, f"{p}.c_proj", bias=proj_bias)


def _mlp(g: GraphWriter, x: str, w: dict[str, np.ndarray], cfg: GPTConfig, i: int) -> str:
    hidden = _activation(g, _linear(g, x, w, f"h.{i}.mlp.c_fc"), cfg.activation)
    return _linear(g, hidden, w, f"h.{i}.mlp.c_proj")


def _residual_layer_norm(g: GraphWriter, h: str, y: str, w: dict[str, np.ndarray], ln: str,
                         eps: float) -> tuple[str, str]:
    """-> (LN(h + y), h + y): the residual add and the next LayerNorm as two plain ops.

    ONNX Runtime 1.31's CPU SkipLayerNormalization is 2.8x slower than Add + LayerNormalization at
    512 positions (1.96 vs 0.71 ms) and no faster at one: a 512-token int8 prefill is ~10 % faster."""
    total = g.one("Add", [h, y], name=f"{ln}.residual")
    return _layer_norm(g, total, w, ln, eps), total


def _fused_attention(g: GraphWriter, x: str, attn_bias: str, w: dict[str, np.ndarray], i: int, n_head: int) -> str:
    """com.microsoft MultiHeadAttention: QKV bias, QK^T, mask, softmax, PV and the cache append in one op.
    Returns the attention block's output after c_proj (B, S, C)."""
    p = f"h.{i}.attn"
    qkv = _linear(g, x, w, f"{p}.c_attn", bias=False)  # (B, S, 3C); the bias goes into MultiHeadAttention
    q, k, v = g.op("Split", [qkv, "const_qkv_split"], n_out=3, name=f"{p}.Split", axis=2)  # (B, S, C) each
    y = g.op("MultiHeadAttention", [q, k, v, g.const(f"{p}.c_attn.bias", w[f"{p}.c_attn.bias"]), "", attn_bias,
                                    C.past_key(i), C.past_value(i)],
             outputs=[f"{p}.out", C.present_key(i), C.present_value(i)], name=f"{p}.mha", domain=MS_DOMAIN,
             num_heads=n_head)[0]
    return _linear(g, y, w, f"{p}.c_proj")


def _buffered_attention(g: GraphWriter, x: str, attn_bias: str, w: dict[str, np.ndarray], i: int, n_head: int,
                        lengths: tuple[str, str]) -> str:
    """com.microsoft GroupQueryAttention over a KV buffer (B, nh, max_len, hs) that past and present share:
    the new keys/values are written in place, nothing is copied. Padding is masked by attn_bias, so every
    row counts its padding as positions (seqlens_k = total - 1 for all rows)."""
    p = f"h.{i}.attn"
    qkv = _linear(g, x, w, f"{p}.c_attn")  # (B, S, 3C)
    q, k, v = g.op("Split", [qkv, "const_qkv_split"], n_out=3, name=f"{p}.Split", axis=2)  # (B, S, C) each
    seqlens_k, total = lengths
    y = g.op("GroupQueryAttention", [q, k, v, C.past_key(i), C.past_value(i), seqlens_k, total, "", "", "", attn_bias],
             outputs=[f"{p}.out", C.present_key(i), C.present_value(i)], name=f"{p}.gqa", domain=MS_DOMAIN,
             num_heads=n_head, kv_num_heads=n_head)[0]
    return _linear(g, y, w, f"{p}.c_proj")


def _buffer_lengths(g: GraphWriter) -> tuple[str, str]:
    """GroupQueryAttention's seqlens_k (B,) int32 = total - 1, and total_sequence_length (scalar int32)."""
    total = g.one("Shape", [C.ATTENTION_MASK], start=1, end=2)  # [T]
    batch = g.one("Shape", [C.INPUT_IDS], start=0, end=1)  # [B]
    seqlens = g.one("Expand", [g.one("Cast", [g.one("Sub", [total, "const_int_one_1d"])], to=TensorProto.INT32), batch])
    return seqlens, g.one("Cast", [g.one("Squeeze", [total])], to=TensorProto.INT32)


def _fused_gpt2_blocks(g: GraphWriter, h: str, allowed: str, w: dict[str, np.ndarray], cfg: GPTConfig,
                       kv_buffer: bool = False) -> str:
    """GPT-2's blocks with ONNX Runtime's fused ops: MultiHeadAttention (or GroupQueryAttention over a
    buffer) and each MLP bias + GELU one FastGelu; residual adds and LayerNorms stay plain (see
    _residual_layer_norm). -> ln_f's output (B, S, C)."""
    eps = cfg.layer_norm_epsilon
    # Additive mask (B, 1, S, T): 0 where allowed, float min elsewhere. Adding a score to float min rounds
    # back to float min, so this equals the reference's replacement, fully masked padding rows included.
    attn_bias = g.one("Where", [allowed, "const_zero", "const_float_min"], name="attention_bias")
    x = _layer_norm(g, h, w, "h.0.ln_1", eps)
    lengths = _buffer_lengths(g) if kv_buffer else None
    for i in range(cfg.n_layer):
        a = (_buffered_attention(g, x, attn_bias, w, i, cfg.n_head, lengths) if lengths
             else _fused_attention(g, x, attn_bias, w, i, cfg.n_head))  # (B, S, C)
        x, h = _residual_layer_norm(g, h, a, w, f"h.{i}.ln_2", eps)
        fc = _linear(g, x, w, f"h.{i}.mlp.c_fc", bias=False)  # (B, S, 4C)
        act = g.one("FastGelu", [fc, g.const(f"h.{i}.mlp.c_fc.bias", w[f"h.{i}.mlp.c_fc.bias"])],
                    name=f"h.{i}.mlp.gelu", domain=MS_DOMAIN)
        m = _linear(g, act, w, f"h.{i}.mlp.c_proj")
        next_ln = f"h.{i + 1}.ln_1" if i + 1 < cfg.n_layer else "ln_f"
        x, h = _residual_layer_norm(g, h, m, w, next_ln, eps)
    return x


def _allowed_mask(g: GraphWriter) -> str:
    """(B, 1, S, T) bool: causal (query at absolute position P + s) and not padding."""
    seq = g.one("Shape", [C.INPUT_IDS], start=1, end=2)  # [S]
    total = g.one("Shape", [C.ATTENTION_MASK], start=1, end=2)  # [T]
    past = g.one("Sub", [total, seq])
    scalar = lambda t: g.one("Squeeze", [t])  # noqa: E731
    q_pos = g.one("Unsqueeze", [g.one("Range", [scalar(past), scalar(total), "const_int_one"]), "const_axis_1"])  # (S, 1)
    k_pos = g.one("Range", [g.one("Squeeze", ["const_int_zero_1d"]), scalar(total), "const_int_one"])  # (T,)
    causal = g.one("LessOrEqual", [k_pos, q_pos])  # (S, T)
    pad = g.one("Unsqueeze", [g.one("Cast", [C.ATTENTION_MASK], to=TensorProto.BOOL), "const_axes_1_2"])  # (B,1,1,T)
    return g.one("And", [causal, pad], name="attention_allowed")


def _keep_last_positions(g: GraphWriter, h: str) -> str:
    """h (B, S, C) -> (B, K, C): the last K = logits_to_keep positions, or all S when it is 0."""
    seq = g.one("Shape", [h], start=1, end=2)  # [S]
    keep = g.one("Reshape", [C.LOGITS_TO_KEEP, "const_int_one_1d"])  # [K]
    start = g.one("Where", [g.one("Greater", [keep, "const_int_zero_1d"]),
                            g.one("Max", [g.one("Sub", [seq, keep]), "const_int_zero_1d"]), "const_int_zero_1d"])
    return g.one("Slice", [h, start, seq, "const_axis_1"], name="keep_last_positions")


def _constants(g: GraphWriter, cfg: GPTConfig) -> None:
    f32 = lambda v: np.array(v, dtype=np.float32)  # noqa: E731
    i64 = lambda v: np.array(v, dtype=np.int64)  # noqa: E731
    for name, value in {
        "const_one": f32(1.0), "const_zero": f32(0.0), "const_half": f32(0.5), "const_sqrt2": f32(math.sqrt(2.0)),
        "const_gelu_coef": f32(0.044715), "const_sqrt_2_over_pi": f32(math.sqrt(2.0 / math.pi)),
        "const_sqrt_head_dim": f32(math.sqrt(cfg.head_dim)), "const_float_min": f32(FLOAT_MIN),
        "const_int_one": i64(1), "const_int_one_1d": i64([1]), "const_int_zero_1d": i64([0]),
        C.LOGITS_TO_KEEP: i64(0), "const_axis_1": i64([1]), "const_axes_1_2": i64([1, 2]),
        "const_qkv_split": i64([cfg.n_embd] * 3), "const_shape_heads": i64([0, 0, cfg.n_head, cfg.head_dim]),
        "const_shape_merge": i64([0, 0, cfg.n_embd]), "const_shape_rows": i64([-1, cfg.n_embd]),
        "const_vocab_1d": i64([cfg.vocab_size]),
    }.items():
        g.const(name, value)


def build_standard_graph(cfg: GPTConfig, weights: dict[str, np.ndarray], opset: int = DEFAULT_OPSET,
                         fused: bool = True, graph: str = C.GRAPH_STANDARD) -> onnx.ModelProto:
    """weights: the reference GPT's state dict as float32 numpy arrays (canonical names).

    fused: GPT-2 with tanh GELU uses ONNX Runtime's attention and FastGelu contrib ops
    (fewer, larger kernels per layer); otherwise, and for the original GPT, plain ONNX ops only.
    graph: "standard" (Optimum's contract) or "kv_buffer" (GPT-2 only: past and present are one
    preallocated buffer the runtime binds to both, updated in place by GroupQueryAttention)."""
    kv_buffer = graph == C.GRAPH_KV_BUFFER
    if kv_buffer and not (cfg.arch == "gpt2" and cfg.activation == "gelu_tanh" and fused):
        raise ValueError("the kv_buffer graph is built for GPT-2 (tanh GELU) with fused ops")
    g = GraphWriter()
    _constants(g, cfg)
    wte = g.const("wte.weight", weights["wte.weight"])  # (V, C): stored once, used by Gather and the LM head
    wpe = g.const("wpe.weight", weights["wpe.weight"])  # (n_positions, C)
    allowed = _allowed_mask(g)
    h = g.one("Add", [g.one("Gather", [wte, C.INPUT_IDS], name="embed_tokens"),
                      g.one("Gather", [wpe, C.POSITION_IDS], name="embed_positions")])  # (B, S, C)
    eps = cfg.layer_norm_epsilon
    fused = fused and cfg.arch == "gpt2" and cfg.activation == "gelu_tanh"
    for i in range(0 if fused else cfg.n_layer):
        if cfg.arch == "gpt2":  # pre-LN
            h = g.one("Add", [h, _attention(g, _layer_norm(g, h, weights, f"h.{i}.ln_1", eps), allowed, weights, cfg, i)])
            h = g.one("Add", [h, _mlp(g, _layer_norm(g, h, weights, f"h.{i}.ln_2", eps), weights, cfg, i)])
        else:  # original GPT: post-LN
            n = _layer_norm(g, g.one("Add", [h, _attention(g, h, allowed, weights, cfg, i)]), weights, f"h.{i}.ln_1", eps)
            h = _layer_norm(g, g.one("Add", [n, _mlp(g, n, weights, cfg, i)]), weights, f"h.{i}.ln_2", eps)
    if fused:
        h = _fused_gpt2_blocks(g, h, allowed, weights, cfg, kv_buffer)
    elif cfg.arch == "gpt2":
        h = _layer_norm(g, h, weights, "ln_f", eps)
    h = _keep_last_positions(g, h)  # (B, K, C)
    # Tied LM head: Gemm with transB reads wte (V, C) as is, so the weight is stored once.
    rows = g.one("Gemm", [g.one("Reshape", [h, "const_shape_rows"]), wte], name="lm_head", transB=1)  # (B*K, V)
    out_shape = g.one("Concat", [g.one("Shape", [h], start=0, end=2), "const_vocab_1d"], axis=0)
    g.one("Reshape", [rows, out_shape], outputs=[C.LOGITS], name="logits_reshape")
    return _model(g, cfg, opset, kv_buffer)


def _model(g: GraphWriter, cfg: GPTConfig, opset: int, kv_buffer: bool = False) -> onnx.ModelProto:
    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    kv = [C.DIM_BATCH, cfg.n_head, C.DIM_BUFFER if kv_buffer else C.DIM_PAST, cfg.head_dim]
    kv_out = [C.DIM_BATCH, cfg.n_head, C.DIM_BUFFER if kv_buffer else C.DIM_TOTAL, cfg.head_dim]
    inputs = [helper.make_tensor_value_info(C.INPUT_IDS, i64, [C.DIM_BATCH, C.DIM_SEQ]),
              helper.make_tensor_value_info(C.ATTENTION_MASK, i64, [C.DIM_BATCH, C.DIM_TOTAL]),
              helper.make_tensor_value_info(C.POSITION_IDS, i64, [C.DIM_BATCH, C.DIM_SEQ])]
    inputs += [helper.make_tensor_value_info(n, f32, kv) for n in C.IONames(cfg.n_layer).past_names]
    # logits_to_keep: in both graphs an input and an initializer (an optional input, default 0), so callers
    # that do not know it (ONNX Runtime GenAI, Optimum) leave it unfed; gptedge's runtime feeds 1 to decode.
    inputs.append(helper.make_tensor_value_info(C.LOGITS_TO_KEEP, i64, []))
    outputs = [helper.make_tensor_value_info(C.LOGITS, f32, [C.DIM_BATCH, C.DIM_LOGITS, cfg.vocab_size])]
    outputs += [helper.make_tensor_value_info(n, f32, kv_out) for n in C.IONames(cfg.n_layer).present_names]
    used = {name for node in g.nodes for name in node.input}
    initializers = [t for t in g.initializers if t.name in used]  # constants of the other architecture
    name = f"gptedge_{C.GRAPH_KV_BUFFER if kv_buffer else C.GRAPH_STANDARD}"
    graph = helper.make_graph(g.nodes, name, inputs, outputs, initializer=initializers)
    opsets = [helper.make_opsetid("", opset)]
    if any(n.domain == MS_DOMAIN for n in g.nodes):
        opsets.append(helper.make_opsetid(MS_DOMAIN, 1))
    model = helper.make_model(graph, opset_imports=opsets, producer_name="gptedge")
    model.ir_version = min(model.ir_version, 9)  # readable by ONNX Runtime releases of the last two years
    return model
