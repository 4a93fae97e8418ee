"""Dynamic INT8: s8 weights, u8 activations quantized at run time.

Every linear MatMul (with its bias Add) and the tied LM head are quantized (a task head's linear only with
recipe.quantize_head: by default it stays fp32, see runtime/modeldir/recipe.py). By default each row of
activations (one position of one sequence) gets its own scale, so a sequence's result does not
depend on what else is in its batch: absmax per row -> QuantizeLinear -> MatMulIntegerToFloat ->
rescale (+ bias). `activation_scale="per-tensor"` keeps the one fused DynamicQuantizeMatMul with
one scale over the whole batch. With --quantize-attention (plain-ops graphs) QK^T and PV become
MatMulInteger of two run-time-quantized activations.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from gptedge.runtime.modeldir.manifest import ModelShape
from gptedge.runtime.modeldir.recipe import QuantizeRecipe

from . import int8_math as qm
from .base import Method, Quantized, QuantizeJob, Storage
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


class _PerRow:
    """Writes y = (a quantized per row) @ W (+ bias): a (..., K) float, W (K, N) int8 with scales (N,).

    u8 activations with zero point 128: a / s + 128, s = absmax(row) / 127 (the rows of a 2-D LM-head
    input, or each position of (B, S, K))."""

    def __init__(self, r: Rewrite):
        self.r = r
        self.opset = next(o.version for o in r.model.opset_import if o.domain in ("", "ai.onnx"))
        self.inv_qmax = r.init("per_row.inv_qmax", np.array(1 / qm.QMAX, np.float32))
        self.tiny = r.init("per_row.tiny", np.array(1e-30, np.float32))  # an all-zero row: scale > 0
        self.one = r.init("per_row.one", np.array(1.0, np.float32))
        self.zp = r.init("per_row.zero_point", np.array(128, np.uint8))
        self.axes = r.init("per_row.axes", np.array([-1], np.int64)) if self.opset >= 18 else None

    def matmul(self, a: str, wq: str, ws: str, wz: str, bias: str | None, out: str, name: str) -> None:
        r = self.r
        r.node("Abs", [a], [f"{name}.abs"], f"{name}.abs")
        reduce = dict(keepdims=1) if self.axes else dict(keepdims=1, axes=[-1])  # axes became an input in opset 18
        r.node("ReduceMax", [f"{name}.abs"] + ([self.axes] if self.axes else []), [f"{name}.absmax"],
               f"{name}.absmax", **reduce)  # (..., 1)
        r.node("Mul", [f"{name}.absmax", self.inv_qmax], [f"{name}.s0"], f"{name}.scale")
        r.node("Max", [f"{name}.s0", self.tiny], [f"{name}.s"], f"{name}.scale_floor")
        r.node("Div", [a, f"{name}.s"], [f"{name}.unit"], f"{name}.normalize")  # (..., K) in -127..127
        r.node("QuantizeLinear", [f"{name}.unit", self.one, self.zp], [f"{name}.q"], f"{name}.quantize")
        r.node("MatMulIntegerToFloat", [f"{name}.q", wq, self.one, ws, self.zp, wz], [f"{name}.y"], name,
               domain=MS_DOMAIN)  # (..., N) = unit @ W
        r.node("Mul", [f"{name}.y", f"{name}.s"], [out if bias is None else f"{name}.ys"], f"{name}.rescale")
        if bias is not None:
            r.node("Add", [f"{name}.ys", bias], [out], f"{name}.bias")


def rewrite_dynamic(model: onnx.ModelProto, per_channel: bool = True, quantize_attention: bool = False,
                    per_row: bool = True, reduce_range: bool = True, quantize_head: bool = True,
                    base_dir: Path | None = None) -> tuple[onnx.ModelProto, dict[str, str]]:
    """Linear MatMuls -> int8 weights times activations quantized at run time (per row, or per tensor
    with DynamicQuantizeMatMul).

    The tied embedding is stored once, transposed, as int8 (C, V) with one scale per vocabulary row:
    the LM head reads it as its B; the embedding gathers its columns (axis 1). base_dir: the model's
    directory, where its external data (if any) is read from. quantize_head False: a task head's linear (the
    score on the extract state) stays a float MatMul.
    """
    r = Rewrite(model, base_dir)
    float_head = None if quantize_head else r.head_linear()
    rows = _PerRow(r) if per_row else None
    qmax = qm.QMAX_REDUCED if reduce_range else qm.QMAX
    wte, gather, gemm = r.tied_embedding()
    # A linear's bias Add goes into DynamicQuantizeMatMul's bias input: one kernel, no (B, S, N) pass.
    head_out = next((n.output[0] for n in model.graph.node if n.name == float_head), None)
    bias_adds = {out: v for out, v in r.bias_adds().items() if out != head_out}  # a float head keeps its own Add
    folded = {add.output[0] for add, _ in bias_adds.values()}
    q, scale = qm.quantize_rows(r.weights[wte], per_channel, qmax)  # (V, C) int8, (V,)
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
        elif node is gemm:  # h (B*K, C) -> logits (B*K, V)
            if rows:
                rows.matmul(node.input[0], wq, ws, wz, None, node.output[0], node.name)
            else:
                r.node("DynamicQuantizeMatMul", [node.input[0], wq, ws, wz], list(node.output), node.name,
                       domain=MS_DOMAIN)
            r.quantized[node.name] = f"{_kernel(per_row)} (LM head, tied int8 weight)"
        elif node.op_type == "Add" and node.output[0] in folded:
            continue  # emitted with its MatMul
        elif r.is_linear(node) and node.name != float_head:
            wq_l, ws_l = qm.quantize_columns(r.weights[node.input[1]], per_channel, qmax)
            w = node.input[1]
            inputs = [node.input[0], r.init(f"{w}.int8", wq_l), r.init(f"{w}.scale", ws_l),
                      r.init(f"{w}.zero_point", np.zeros(ws_l.shape, np.int8))]
            add, bias = bias_adds.get(node.output[0], (node, None))
            if rows:
                rows.matmul(*inputs, bias, add.output[0], node.name)
            else:
                r.node("DynamicQuantizeMatMul", inputs + ([bias] if bias else []), list(add.output), node.name,
                       domain=MS_DOMAIN)
            r.quantized[node.name] = _kernel(per_row) + (" (+ bias)" if bias else "")
        elif quantize_attention and node.op_type == "MatMul":
            _dynamic_int8_matmul(r, node.input[0], node.input[1], node.output[0], node.name)
            r.quantized[node.name] = "MatMulInteger (activation x activation)"
        else:
            r.new_nodes.append(node)
    return r.finish("gptedge dynamic int8"), r.quantized


def _kernel(per_row: bool) -> str:
    return "MatMulIntegerToFloat, activations per row" if per_row else "DynamicQuantizeMatMul"




def check(recipe: QuantizeRecipe, shape: ModelShape, calibration_text: str | None) -> None:
    """Nothing beyond the shared guard: every standard or kv_buffer graph can be quantized dynamically."""


def apply(job: QuantizeJob) -> Quantized:
    recipe = job.recipe
    model, nodes = rewrite_dynamic(job.model, recipe.per_channel, recipe.quantize_attention,
                                   per_row=recipe.activation_scale == "per-row", reduce_range=recipe.reduce_range,
                                   quantize_head=recipe.quantize_head, base_dir=job.model_dir)
    return Quantized(model, nodes, job.recipe)


def storage(recipe: QuantizeRecipe) -> Storage:
    scales = "per output channel" if recipe.per_channel else "per tensor"
    bits = "7-bit range (-63..63)" if recipe.reduce_range else "-127..127"
    activations = ("u8 quantized at run time, one scale per row (MatMulIntegerToFloat)"
                   if recipe.activation_scale == "per-row" else "u8 quantized at run time, one scale per tensor "
                   "(DynamicQuantizeMatMul)")
    return Storage(weights=f"s8 symmetric {bits}, {scales}", activations=activations,
                   embedding_and_lm_head="tied weight stored once as int8 (C, V), one scale per vocabulary row; "
                                         "LM head DynamicQuantizeMatMul, embedding Gather(axis=1)")


METHOD = Method(name="dynamic", check=check, apply=apply, storage=storage, quantizes_attention=True)
