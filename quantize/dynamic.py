"""Dynamic INT8: s8 weights, u8 activations quantized at run time (DynamicQuantizeMatMul).

Every linear MatMul (with its bias Add folded in) and the tied LM head become
DynamicQuantizeMatMul; with --quantize-attention (plain-ops graphs) QK^T and PV become
MatMulInteger of two run-time-quantized activations.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from gptedge.runtime.manifest import ModelShape

from . import int8_math as qm
from .methods import Method, Quantized, QuantizeJob, Storage
from .recipe import QuantizeRecipe
from .rewrite import MS_DOMAIN, Rewrite


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


def rewrite_dynamic(model: onnx.ModelProto, per_channel: bool = True,
                    quantize_attention: bool = False) -> tuple[onnx.ModelProto, dict[str, str]]:
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




def check(recipe: QuantizeRecipe, shape: ModelShape, calibration_text: str | None) -> None:
    """Nothing beyond the shared guard: every standard or kv_buffer graph can be quantized dynamically."""


def apply(job: QuantizeJob) -> Quantized:
    model, nodes = rewrite_dynamic(job.model, job.recipe.per_channel, job.recipe.quantize_attention)
    return Quantized(model, nodes, job.recipe)


def storage(recipe: QuantizeRecipe) -> Storage:
    scales = "per output channel" if recipe.per_channel else "per tensor"
    return Storage(weights=f"s8 symmetric, {scales}", activations="u8 quantized at run time (DynamicQuantizeMatMul)",
                   embedding_and_lm_head="tied weight stored once as int8 (C, V), one scale per vocabulary row; "
                                         "LM head DynamicQuantizeMatMul, embedding Gather(axis=1)")


METHOD = Method(name="dynamic", check=check, apply=apply, storage=storage, quantizes_attention=True)
