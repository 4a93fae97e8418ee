"""`--rotate-down`: each MLP down projection's input rotated online by a randomized Hadamard transform.

Why: at accuracy level 4 MatMulNBits rounds each linear's input to int8 per block of `block_size` channels, and at
8 bits that rounding is most of the error. Down's input (act(gate) * up, or an ungated MLP's gelu(fc)) is the one with
outlier channels (max / mean |x| 66-114 on the trained gated-MLP sample, against 5-6 for the normalized inputs of
the other linears), so one large channel sets the rounding step of its whole block. A Hadamard rotation H of each
block spreads it over the block; the weights' rows take H^T, so x W = (x H)(H^T W) exactly in fp32. Measured
(docs/quantization.md#rotated-down-projections): on the two trained gated-MLP checkpoints, 8-bit blocks of 64 go from
1.31-1.40x llama.cpp Q8_0's KL to 0.82-1.02x (0.72-0.95x with GPTQ rounding on mse scales).

The graph: before each down MatMul, Reshape (B, T, I) -> (B, T, I/b, b), MatMul by one shared (1, b, b) H,
Reshape back: three small ops a layer (b x b multiply-adds per channel). H is stored 3-D so no quantizer takes it
for a linear (Rewrite.is_linear wants a 2-D weight), and it stays float. b is the recipe's block size, so each
rotation mixes exactly the channels one activation block rounds together.

H = S Hn / sqrt(b): Hn the Sylvester Hadamard matrix (b a power of two), S a seeded diagonal of random signs
(a plain Hadamard maps a constant block onto one channel; the signs keep such inputs spread).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from gptedge.onnx_files import Initializers
from gptedge.runtime.errors import InvalidArgumentError
from gptedge.runtime.modeldir.recipe import ROTATION_INIT as ROTATION  # the shared (1, b, b) initializer

SIGN_SEED = 0


def randomized_hadamard(size: int, seed: int = SIGN_SEED) -> np.ndarray:
    """-> (size, size) float64, orthogonal: rows of a Sylvester Hadamard matrix scaled by 1/sqrt(size), each row
    multiplied by a seeded random sign."""
    if size < 1 or size & (size - 1):
        raise InvalidArgumentError(f"a Hadamard rotation needs a power-of-two size, got {size}")
    h = np.ones((1, 1))
    while h.shape[0] < size:
        h = np.block([[h, h], [h, -h]])
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=size)
    return signs[:, None] * h / np.sqrt(size)


def down_linears(model: onnx.ModelProto, weights: Initializers, names: dict[str, str]) -> list[onnx.NodeProto]:
    """The MatMul nodes of every block's MLP down projection (neutral name h.N.mlp.down, as the family's registry
    line names its graph linear), each reading a 2-D (I, C) weight."""
    downs = {graph for graph, neutral in names.items() if neutral.endswith(".mlp.down")}
    return [n for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in weights
            and n.input[1].removesuffix(".weight") in downs and len(weights.shape(n.input[1])) == 2]


def rotate_down_inputs(model: onnx.ModelProto, weights: Initializers, names: dict[str, str],
                       block_size: int) -> onnx.ModelProto:
    """-> a copy of model whose down projections read x H (block-diagonal, blocks of block_size) and hold H^T W:
    the same function in fp32. The rotated weights are written inline (the source's external file is not touched).
    A graph with no down projection, or whose MLP width block_size does not divide, is refused in one line."""
    downs = down_linears(model, weights, names)
    if not downs:
        raise InvalidArgumentError("--rotate-down: this graph has no MLP down projection (h.N.mlp.down) to rotate")
    h = randomized_hadamard(block_size)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    by_name = {t.name: t for t in out.graph.initializer}
    rotated = {n.name for n in downs}
    for node in downs:
        width = weights.shape(node.input[1])[0]
        if width % block_size:
            raise InvalidArgumentError(f"--rotate-down: block size {block_size} does not divide {node.input[1]}'s "
                                       f"K={width}")
        w = weights[node.input[1]].astype(np.float64).reshape(width // block_size, block_size, -1)  # (I/b, b, C)
        turned = np.einsum("ji,bjc->bic", h, w).reshape(width, -1)  # each block's rows: H^T W_b
        by_name[node.input[1]].CopyFrom(numpy_helper.from_array(turned.astype(np.float32), node.input[1]))
    out.graph.initializer.extend([
        numpy_helper.from_array(h[None].astype(np.float32), ROTATION),  # (1, b, b)
        numpy_helper.from_array(np.array([0, 0, -1, block_size], np.int64), f"{ROTATION}.blocks"),
        numpy_helper.from_array(np.array([0, 0, -1], np.int64), f"{ROTATION}.joined")])
    nodes = []
    for node in out.graph.node:
        if node.name in rotated:
            p = f"{node.name}.rotate{block_size}"  # the size in the names: gptq's factor cache keys on input names
            nodes += [helper.make_node("Reshape", [node.input[0], f"{ROTATION}.blocks"], [f"{p}.blocks"],
                                       f"{p}.split"),  # (B, T, I/b, b)
                      helper.make_node("MatMul", [f"{p}.blocks", ROTATION], [f"{p}.turned"], f"{p}.matmul"),
                      helper.make_node("Reshape", [f"{p}.turned", f"{ROTATION}.joined"], [f"{p}.out"],
                                       f"{p}.join")]  # (B, T, I)
            node.input[0] = f"{p}.out"
        nodes.append(node)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out
