"""A kv_buffer graph's rotary taken back out of GroupQueryAttention, for the fp16 targets.

export writes the rotary families' kv_buffer attention with the rotation inside GroupQueryAttention where the
installed ONNX Runtime allows it (export/graph_rotary.py: do_rotary=1 with position_ids and query_seqlens, the
packed q | k | v projection as the op's query). fp16 graphs are for the CUDA provider, whose attention gptedge
checked in the other form (RotaryEmbedding on q and k before the op) and on ONNX Runtime 1.31, which has no
query_seqlens; so the fp16 targets (`--method fp16`, weight-only `--float16`) get that form back (an fp16 cache
on an fp32 graph runs on the CPU and keeps the rotary inside).
Same computation, same cache content: both rotate each row at its own position_ids.

Per GroupQueryAttention with do_rotary=1 (packed input (B, S, (nh + 2 nkv) hs)):
    Split(packed) -> q (B, S, nh hs), k, v (B, S, nkv hs)
    RotaryEmbedding(q | k, position_ids, cos_cache, sin_cache), rotary_embedding_dim where partial
    GroupQueryAttention(q, k, v, ..., no cos / sin / position_ids / query_seqlens), do_rotary dropped
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from gptedge.runtime.contract import GQA_COS_CACHE, GQA_POSITION_IDS, GQA_QUERY_SEQLENS, GQA_SIN_CACHE

from .rewrite import MS_DOMAIN


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def rotary_outside(model: onnx.ModelProto, head_dim: int) -> int:
    """In place: every GroupQueryAttention that rotates inside takes rotated q, k and v instead -> the number of
    nodes rewritten. head_dim: the model's head size (its rotary width is read from cos_cache's shape)."""
    g = model.graph
    widths = {i.name: i.dims[1] for i in g.initializer if len(i.dims) == 2}  # cos_cache (n_positions, rotary_dim / 2)
    nodes, rewritten = [], 0
    for node in g.node:
        attrs = _attrs(node)
        if node.op_type != "GroupQueryAttention" or attrs.get("do_rotary", 0) != 1:
            nodes.append(node)
            continue
        if int(attrs.get("rotary_interleaved", 0)) != 0:
            raise ValueError(f"{node.name}: an interleaved rotary is not one gptedge writes")
        inputs = list(node.input) + [""] * (GQA_QUERY_SEQLENS + 1 - len(node.input))
        nh, nkv, packed = attrs["num_heads"], attrs["kv_num_heads"], inputs[0]
        sizes = f"{node.name}.split_sizes"
        g.initializer.append(numpy_helper.from_array(np.array([nh * head_dim] + [nkv * head_dim] * 2, np.int64),
                                                     sizes))
        q, k, v = (f"{node.name}.{t}" for t in "qkv")
        nodes.append(helper.make_node("Split", [packed, sizes], [q, k, v], name=f"{node.name}.split", axis=-1))
        rotary_dim = 2 * widths[inputs[GQA_COS_CACHE]]
        rotated = []
        for t, heads in ((q, nh), (k, nkv)):
            partial = {} if rotary_dim == head_dim else {"rotary_embedding_dim": rotary_dim, "num_heads": heads}
            reads = [t, inputs[GQA_POSITION_IDS], inputs[GQA_COS_CACHE], inputs[GQA_SIN_CACHE]]
            nodes.append(helper.make_node("RotaryEmbedding", reads,
                                          [f"{t}_rotated"], name=f"{t}.rotary", domain=MS_DOMAIN, interleaved=0,
                                          **partial))
            rotated.append(f"{t}_rotated")
        inputs[0:3] = [*rotated, v]
        inputs[GQA_COS_CACHE] = inputs[GQA_SIN_CACHE] = inputs[GQA_POSITION_IDS] = inputs[GQA_QUERY_SEQLENS] = ""
        while inputs and inputs[-1] == "":  # trailing empty optional inputs dropped
            inputs.pop()
        kept = {n: a for n, a in attrs.items() if n not in ("do_rotary", "rotary_interleaved")}
        nodes.append(helper.make_node("GroupQueryAttention", inputs, list(node.output), name=node.name,
                                      domain=node.domain, **kept))
        rewritten += 1
    if rewritten:
        del g.node[:]
        g.node.extend(nodes)
        _drop_unused(g)
    return rewritten


def _drop_unused(g: onnx.GraphProto) -> None:
    """Nodes whose outputs nothing reads any more (query_seqlens' Min and what fed only it), repeated to a fixpoint,
    then the initializers no node reads (the constant only that Add read); graph inputs and outputs stay."""
    outputs = {o.name for o in g.output}
    while True:
        used = ({i for n in g.node for i in n.input} | outputs) - {""}
        alive = [n for n in g.node if any(o in used for o in n.output)]
        if len(alive) == len(g.node):
            break
        del g.node[:]
        g.node.extend(alive)
    used |= {v.name for v in g.input}
    kept = [i for i in g.initializer if i.name in used]
    del g.initializer[:]
    g.initializer.extend(kept)
