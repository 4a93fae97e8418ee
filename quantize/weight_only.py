"""Weight-only 8-bit: MatMulNBits with one scale per block of weights along K; activations stay float
(or are quantized per block inside the kernel, accuracy_level 4).

Every linear MatMul and the tied LM head become MatMulNBits; the embedding gathers rows of the
same blocks and dequantizes them with plain ops.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from gptedge.runtime.errors import QuantizationError
from gptedge.runtime.manifest import ModelShape

from . import int8_math as qm
from .methods import Method, Quantized, QuantizeJob, Storage
from .recipe import QuantizeRecipe
from .rewrite import MS_DOMAIN, Rewrite


def rewrite_weight_only(model: onnx.ModelProto, block_size: int = 32,
                        accuracy_level: int = 0) -> tuple[onnx.ModelProto, dict[str, str]]:
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


def check(recipe: QuantizeRecipe, shape: ModelShape, calibration_text: str | None) -> None:
    if shape.n_embd % recipe.block_size:
        raise QuantizationError(f"n_embd {shape.n_embd} is not a multiple of block size {recipe.block_size}")


def apply(job: QuantizeJob) -> Quantized:
    model, nodes = rewrite_weight_only(job.model, job.recipe.block_size, job.recipe.accuracy_level)
    return Quantized(model, nodes, job.recipe)


def storage(recipe: QuantizeRecipe) -> Storage:
    activations = ("float" if recipe.accuracy_level == 0 else
                   f"quantized per block inside MatMulNBits (accuracy_level {recipe.accuracy_level})")
    return Storage(weights=f"8-bit MatMulNBits, symmetric, one scale per block of {recipe.block_size} along K",
                   activations=activations,
                   embedding_and_lm_head="tied weight stored once as MatMulNBits blocks (V, C/bs, bs); LM head "
                                         "MatMulNBits, embedding gathers rows and dequantizes")


# Activations reach QK^T and PV in float: there is nothing for --quantize-attention to act on.
METHOD = Method(name="weight-only", check=check, apply=apply, storage=storage, quantizes_attention=False)
