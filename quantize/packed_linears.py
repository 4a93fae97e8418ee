"""Sibling MatMulNBits packed into one: linears that read the same input run as one wider MatMulNBits and a Split.

Why: at batch 1 each MatMulNBits is a fork-join of the session's threads over a few hundred KB of weights, and a
gated MLP's gate and up projections read the same normalized input. One node of width N_gate + N_up instead of two
saves one of the ~150 dispatches a step at the SmolLM2-135M shape: a decode step 3-4 % faster on a 2-core Zen 4
(docs/quantization.md#packed-sibling-linears). It is exact: MatMulNBits rounds its input per block along K, the
same for every output column, and each column reads its own rows of B, scales and zero points, so packing along N
changes no output.

Only siblings alike in every attribute (K, bits, block size, accuracy level) and in their inputs' layout (zero
points or none, no bias / g_idx input) pack: a 4-bit recipe that keeps one of them at 8 bits leaves both apart.
The packed node's initializers are named by the linears' own joined with "+" ("h.3.mlp.gate_proj.weight.q8+
h.3.mlp.up_proj.weight.q8"): runtime/checks/model_claims.py counts the linears a node holds by them. Nothing here
names a family: every graph whose linears share an input gets it (today the gated MLPs' gate and up; q | k | v are
packed at export already).
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import helper, numpy_helper

from gptedge.runtime.modeldir.recipe import PACKED_JOIN

from .rewrite import MS_DOMAIN

log = logging.getLogger(__name__)
ATTRIBUTES = ("K", "bits", "block_size", "accuracy_level")


def _key(node: onnx.NodeProto, inline: dict[str, onnx.TensorProto]) -> tuple | None:
    """What siblings must share to pack, or None where this node cannot: its attributes, its input, and which of
    B / scales / zero_points it has (all inline initializers; no bias or g_idx)."""
    if node.op_type != "MatMulNBits" or node.domain != MS_DOMAIN or not 3 <= len(node.input) <= 4:
        return None
    if not all(name in inline for name in node.input[1:]):
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if set(attrs) - {*ATTRIBUTES, "N"}:
        return None
    return (node.input[0], len(node.input), *(attrs.get(a) for a in ATTRIBUTES))


def sibling_groups(model: onnx.ModelProto) -> list[list[onnx.NodeProto]]:
    """MatMulNBits nodes that can pack, in groups of two or more, each group in graph order."""
    inline = {t.name: t for t in model.graph.initializer if not t.external_data}
    groups: dict[tuple, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        key = _key(node, inline)
        if key is not None:
            groups.setdefault(key, []).append(node)
    return [g for g in groups.values() if len(g) > 1]


def pack_sibling_linears(model: onnx.ModelProto) -> onnx.ModelProto:
    """-> model with every group of sibling MatMulNBits replaced, where its first member stood, by one MatMulNBits
    over B, scales (and zero points) concatenated along N, and a Split back into the members' outputs. In place;
    returned for chaining."""
    groups = sibling_groups(model)
    if not groups:
        return model
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    first = {id(g[0]): g for g in groups}
    members = {id(n) for g in groups for n in g}
    packed_inits, nodes = [], []
    for node in graph.node:
        if id(node) in first:
            nodes += _packed(first[id(node)], inits, packed_inits)
        elif id(node) not in members:
            nodes.append(node)
    used = {name for g in groups for n in g for name in n.input[1:]}
    keep = [t for t in graph.initializer if t.name not in used]
    del graph.initializer[:]
    graph.initializer.extend(keep + packed_inits)
    del graph.node[:]
    graph.node.extend(nodes)
    log.info("packed %d groups of sibling linears (%d MatMulNBits into %d)", len(groups),
             sum(len(g) for g in groups), len(groups))
    return model


def _packed(group: list[onnx.NodeProto], inits: dict[str, onnx.TensorProto],
            out: list[onnx.TensorProto]) -> list[onnx.NodeProto]:
    """One group -> [its MatMulNBits, its Split]; the packed initializers appended to `out`."""
    widths = [next(a.i for a in n.attribute if a.name == "N") for n in group]
    names = []
    # B (N, K/bs, bs*bits/8), scales (N, K/bs), zero points (N, ...) or any of them flat: rows of N first either way,
    # so joining along axis 0 puts each member's rows after the last's
    for slot in range(1, len(group[0].input)):
        name = PACKED_JOIN.join(n.input[slot] for n in group)
        out.append(numpy_helper.from_array(np.concatenate([numpy_helper.to_array(inits[n.input[slot]])
                                                           for n in group]), name))
        names.append(name)
    attrs = {a.name: helper.get_attribute_value(a) for a in group[0].attribute}
    attrs["N"] = sum(widths)
    stem = PACKED_JOIN.join(n.name for n in group)
    packed_out = f"{stem}.out"  # (B, S, sum N)
    split_sizes = numpy_helper.from_array(np.array(widths, np.int64), f"{stem}.split")
    out.append(split_sizes)
    matmul = helper.make_node("MatMulNBits", [group[0].input[0], *names], [packed_out], name=stem,
                              domain=MS_DOMAIN, **attrs)
    split = helper.make_node("Split", [packed_out, split_sizes.name], [n.output[0] for n in group],
                             name=f"{stem}.Split", axis=-1)
    return [matmul, split]
