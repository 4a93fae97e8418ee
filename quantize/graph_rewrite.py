"""Graph surgery: swap the float MatMuls / tied embedding of a standard graph for INT8 ones.

The math lives in int8_math.py; this file only finds nodes and rewires them. Nodes are found
by what they are (a MatMul with a 2-D weight initializer; an initializer shared by a Gather
and a Gemm with transB, i.e. the tied embedding / LM head), not by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from . import int8_math as qm

MS_DOMAIN = "com.microsoft"


@dataclass
class Rewrite:
    """Collects the new graph while walking the old one."""

    model: onnx.ModelProto
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    new_nodes: list[onnx.NodeProto] = field(default_factory=list)
    new_inits: list[onnx.TensorProto] = field(default_factory=list)
    quantized: dict[str, str] = field(default_factory=dict)  # node name -> what it became

    def __post_init__(self) -> None:
        self.weights = {t.name: numpy_helper.to_array(t) for t in self.model.graph.initializer}

    def init(self, name: str, value: np.ndarray) -> str:
        self.new_inits.append(numpy_helper.from_array(np.require(value, requirements="C"), name))
        return name

    def node(self, op: str, inputs: list[str], outputs: list[str], name: str, domain: str = "", **attrs) -> None:
        self.new_nodes.append(helper.make_node(op, inputs, outputs, name=name, domain=domain, **attrs))

    def is_linear(self, node: onnx.NodeProto) -> bool:
        return node.op_type == "MatMul" and node.input[1] in self.weights and self.weights[node.input[1]].ndim == 2

    def bias_adds(self) -> dict[str, tuple[onnx.NodeProto, str]]:
        """Linear MatMul output -> (the Add that is its only consumer, the 1-D (N,) initializer it adds)."""
        users: dict[str, list[onnx.NodeProto]] = {}
        for n in self.model.graph.node:
            for i in n.input:
                users.setdefault(i, []).append(n)
        graph_outputs = {o.name for o in self.model.graph.output}
        found = {}
        for node in self.model.graph.node:
            out = node.output[0]
            if not self.is_linear(node) or out in graph_outputs or len(users.get(out, [])) != 1:
                continue
            add = users[out][0]
            bias = add.input[1] if add.input[0] == out else add.input[0]
            width = self.weights[node.input[1]].shape[1]
            if add.op_type == "Add" and bias in self.weights and self.weights[bias].shape == (width,):
                found[out] = (add, bias)
        return found

    def tied_embedding(self) -> tuple[str, onnx.NodeProto, onnx.NodeProto]:
        """-> (weight name, its Gather, its LM-head Gemm)."""
        for gemm in self.model.graph.node:
            if gemm.op_type == "Gemm" and gemm.input[1] in self.weights:
                trans_b = next((a.i for a in gemm.attribute if a.name == "transB"), 0)
                gather = next((n for n in self.model.graph.node if n.op_type == "Gather" and n.input[0] == gemm.input[1]), None)
                if trans_b == 1 and gather is not None:
                    return gemm.input[1], gather, gemm
        raise ValueError("graph has no tied embedding / LM head (Gather + Gemm transB on one weight)")

    def finish(self, producer_note: str) -> onnx.ModelProto:
        g = self.model.graph
        used = {i for n in self.new_nodes for i in n.input}
        inits = [t for t in list(g.initializer) + self.new_inits if t.name in used]
        graph = helper.make_graph(self.new_nodes, g.name, list(g.input), list(g.output), initializer=inits)
        opsets = [o for o in self.model.opset_import if o.domain not in ("", MS_DOMAIN)]
        opsets += [helper.make_opsetid("", next(o.version for o in self.model.opset_import if o.domain in ("", "ai.onnx"))),
                   helper.make_opsetid(MS_DOMAIN, 1)]
        out = helper.make_model(graph, opset_imports=opsets, producer_name="gptedge", doc_string=producer_note)
        out.ir_version = self.model.ir_version
        return out


def _dynamic_int8_matmul(r: Rewrite, a: str, b: str, out: str, name: str) -> None:
    """Activation x activation in int8: both quantized at run time (u8, per tensor), MatMulInteger, rescale."""
    qa, sa, za = (f"{name}.a_q", f"{name}.a_scale", f"{name}.a_zp")
    qb, sb, zb = (f"{name}.b_q", f"{name}.b_scale", f"{name}.b_zp")
    r.node("DynamicQuantizeLinear", [a], [qa, sa, za], f"{name}.quantize_a")
    r.node("DynamicQuantizeLinear", [b], [qb, sb, zb], f"{name}.quantize_b")
    r.node("MatMulInteger", [qa, qb, za, zb], [f"{name}.i32"], f"{name}.MatMulInteger")
    r.node("Cast", [f"{name}.i32"], [f"{name}.f32"], f"{name}.cast", to=TensorProto.FLOAT)
    r.node("Mul", [sa, sb], [f"{name}.scale"], f"{name}.scale_mul")
    r.node("Mul", [f"{name}.f32", f"{name}.scale"], [out], f"{name}.rescale")


def rewrite_dynamic(model: onnx.ModelProto, per_channel: bool = True, quantize_attention: bool = False) -> tuple[onnx.ModelProto, dict]:
    """Linear MatMuls -> DynamicQuantizeMatMul (s8 weights, u8 activations quantized at run time).

    The tied embedding is stored once, transposed, as int8 (C, V) with one scale per vocabulary row:
    the LM head reads it as DynamicQuantizeMatMul's B; the embedding gathers its columns (axis 1).
    """
    r = Rewrite(model)
    wte, gather, gemm = r.tied_embedding()
    # A linear's bias Add goes into DynamicQuantizeMatMul's bias input: one kernel, no (B, S, N) pass.
    bias_adds = r.bias_adds()
    folded = {add.output[0] for add, _ in bias_adds.values()}
    q, scale = qm.quantize_rows(r.weights[wte], per_channel)  # (V, C) int8, (V,)
    wq = r.init(f"{wte}.int8_t", q.T)  # (C, V)
    ws = r.init(f"{wte}.scale", scale)  # (V,)
    wz = r.init(f"{wte}.zero_point", np.zeros(scale.shape, np.int8))
    for node in model.graph.node:
        if node is gather:  # (B, S) ids -> (B, S, C) float
            ids, out = node.input[1], node.output[0]
            r.node("Gather", [wq, ids], [f"{out}.cbs"], f"{node.name}.q", axis=1)  # (C, B, S) int8
            r.node("Transpose", [f"{out}.cbs"], [f"{out}.bsc"], f"{node.name}.t", perm=[1, 2, 0])  # (B, S, C)
            r.node("Cast", [f"{out}.bsc"], [f"{out}.f"], f"{node.name}.cast", to=TensorProto.FLOAT)
            r.node("Gather", [ws, ids], [f"{out}.s"], f"{node.name}.scale")  # (B, S)
            r.node("Unsqueeze", [f"{out}.s", r.init(f"{node.name}.axes", np.array([-1], np.int64))], [f"{out}.s1"],
                   f"{node.name}.unsqueeze")
            r.node("Mul", [f"{out}.f", f"{out}.s1"], [out], f"{node.name}.dequantize")
            r.quantized[node.name] = "int8 embedding (per-row scale, shared with the LM head)"
        elif node is gemm:
            r.node("DynamicQuantizeMatMul", [node.input[0], wq, ws, wz], list(node.output), node.name, domain=MS_DOMAIN)
            r.quantized[node.name] = "DynamicQuantizeMatMul (LM head, tied int8 weight)"
        elif node.op_type == "Add" and node.output[0] in folded:
            continue  # emitted with its MatMul
        elif r.is_linear(node):
            wq_l, ws_l = qm.quantize_columns(r.weights[node.input[1]], per_channel)
            w = node.input[1]
            inputs = [node.input[0], r.init(f"{w}.int8", wq_l), r.init(f"{w}.scale", ws_l),
                      r.init(f"{w}.zero_point", np.zeros(ws_l.shape, np.int8))]
            outputs = list(node.output)
            if node.output[0] in bias_adds:
                add, bias = bias_adds[node.output[0]]
                inputs.append(bias)  # (N,)
                outputs = list(add.output)
            r.node("DynamicQuantizeMatMul", inputs, outputs, node.name, domain=MS_DOMAIN)
            r.quantized[node.name] = "DynamicQuantizeMatMul" + (" (+ bias)" if node.output[0] in bias_adds else "")
        elif quantize_attention and node.op_type == "MatMul":
            _dynamic_int8_matmul(r, node.input[0], node.input[1], node.output[0], node.name)
            r.quantized[node.name] = "MatMulInteger (activation x activation)"
        else:
            r.new_nodes.append(node)
    return r.finish("gptedge dynamic int8"), r.quantized


def rewrite_weight_only(model: onnx.ModelProto, block_size: int = 32, accuracy_level: int = 0) -> tuple[onnx.ModelProto, dict]:
    """Linear MatMuls and the LM head -> MatMulNBits (8-bit blocks along K, activations stay float).

    The tied embedding is stored once in MatMulNBits' layout (V, C/bs, bs) uint8; the embedding
    gathers rows of it and dequantizes them with plain ops.
    """
    r = Rewrite(model)
    wte, gather, gemm = r.tied_embedding()
    vocab, width = r.weights[wte].shape
    q, scale = qm.quantize_blocks_u8(r.weights[wte], block_size)  # (V, C/bs, bs), (V, C/bs)
    wq, ws = r.init(f"{wte}.q8", q), r.init(f"{wte}.scales", scale)
    for node in model.graph.node:
        if node is gather:
            ids, out = node.input[1], node.output[0]
            r.node("Gather", [wq, ids], [f"{out}.q"], f"{node.name}.q")  # (B, S, C/bs, bs) uint8
            r.node("Cast", [f"{out}.q"], [f"{out}.f"], f"{node.name}.cast", to=TensorProto.FLOAT)
            r.node("Sub", [f"{out}.f", r.init(f"{node.name}.zp", np.array(128.0, np.float32))], [f"{out}.c"],
                   f"{node.name}.center")
            r.node("Gather", [ws, ids], [f"{out}.s"], f"{node.name}.scale")  # (B, S, C/bs)
            r.node("Unsqueeze", [f"{out}.s", r.init(f"{node.name}.axes", np.array([-1], np.int64))], [f"{out}.s1"],
                   f"{node.name}.unsqueeze")
            r.node("Mul", [f"{out}.c", f"{out}.s1"], [f"{out}.blocks"], f"{node.name}.dequantize")
            r.node("Reshape", [f"{out}.blocks", r.init(f"{node.name}.shape", np.array([0, 0, width], np.int64))],
                   [out], f"{node.name}.reshape")
            r.quantized[node.name] = f"8-bit embedding (blocks of {block_size}, shared with the LM head)"
        elif node is gemm:
            r.node("MatMulNBits", [node.input[0], wq, ws], list(node.output), node.name, domain=MS_DOMAIN,
                   K=width, N=vocab, bits=8, block_size=block_size, accuracy_level=accuracy_level)
            r.quantized[node.name] = "MatMulNBits (LM head, tied 8-bit weight)"
        elif r.is_linear(node):
            w = r.weights[node.input[1]]  # (K, N)
            wq_l, ws_l = qm.quantize_blocks_u8(w.T, block_size)
            r.node("MatMulNBits", [node.input[0], r.init(f"{node.input[1]}.q8", wq_l),
                                   r.init(f"{node.input[1]}.scales", ws_l)],
                   list(node.output), node.name, domain=MS_DOMAIN, K=w.shape[0], N=w.shape[1], bits=8,
                   block_size=block_size, accuracy_level=accuracy_level)
            r.quantized[node.name] = "MatMulNBits"
        else:
            r.new_nodes.append(node)
    return r.finish("gptedge weight-only int8"), r.quantized
