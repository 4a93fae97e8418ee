"""The facts of an ORT-format graph (model.ort, `gptedge pack --target mobile`), read from its flatbuffer: the same
GraphFacts onnx_wire reads from a model.onnx (nodes with their op types and integer attributes, initializers'
dims and element types, the graph's input and output types), so a mobile pack's claims are checked as any
dir's. The table and field slots are onnxruntime's schema (onnxruntime/core/flatbuffers/schema/ort.fbs), read
with the `flatbuffers` package onnxruntime itself depends on.

What the ORT format cannot show is said by `unchecked()`: its initializers are folded and renamed by the
converter's optimizations, so the recipe's per-weight checks (per_channel, reduce_range) are not made on it.
"""

from __future__ import annotations

import struct
from pathlib import Path

from ..errors import ModelDirError
from ..modeldir.onnx_wire import ELEM_TYPES, GraphFacts, Initializer, Node

# vtable slots (4 + 2 x field index) of the tables read
SESSION_MODEL = 6
MODEL_PRODUCER, MODEL_GRAPH = 8, 18
GRAPH_INITIALIZERS, GRAPH_NODE_ARGS, GRAPH_NODES, GRAPH_INPUTS, GRAPH_OUTPUTS = 4, 6, 8, 14, 16
NODE_DOMAIN, NODE_OP_TYPE, NODE_INPUTS, NODE_ATTRIBUTES = 8, 14, 20, 24
ATTR_NAME, ATTR_TYPE, ATTR_I = 4, 8, 12
ATTR_INT = 2  # AttributeType.INT
TENSOR_NAME, TENSOR_DIMS, TENSOR_TYPE = 4, 8, 10
VALUE_NAME, VALUE_TYPE = 4, 8
TYPE_VALUE = 8
TENSOR_ELEM_TYPE = 4


def _table(t, slot):
    from flatbuffers.table import Table

    o = t.Offset(slot)
    return Table(t.Bytes, t.Indirect(o + t.Pos)) if o else None


def _tables(t, slot) -> list:
    from flatbuffers.table import Table

    o = t.Offset(slot)
    if not o:
        return []
    start = t.Vector(o)
    return [Table(t.Bytes, t.Indirect(start + 4 * j)) for j in range(t.VectorLen(o))]


def _string(t, slot) -> str:
    o = t.Offset(slot)
    return t.String(o + t.Pos).decode("utf-8", "replace") if o else ""


def _strings(t, slot) -> list[str]:
    o = t.Offset(slot)
    if not o:
        return []
    start = t.Vector(o)
    return [t.String(start + 4 * j).decode("utf-8", "replace") for j in range(t.VectorLen(o))]


def _number(t, slot, flags, default=0):
    o = t.Offset(slot)
    return t.Get(flags, o + t.Pos) if o else default


def read_ort_facts(path: str | Path) -> GraphFacts:
    """The GraphFacts of an ORT-format model; ModelDirError naming it when its flatbuffer cannot be read."""
    from flatbuffers import encode, number_types as N, packer
    from flatbuffers.table import Table

    try:
        buf = bytearray(Path(path).read_bytes())
        session = Table(buf, encode.Get(packer.uoffset, buf, 0))
        model = _table(session, SESSION_MODEL)
        graph = _table(model, MODEL_GRAPH) if model else None
        if graph is None:
            raise ValueError("no graph")
        facts = GraphFacts(producer=_string(model, MODEL_PRODUCER))
        for node in _tables(graph, GRAPH_NODES):
            ints = {_string(a, ATTR_NAME): _number(a, ATTR_I, N.Int64Flags)
                    for a in _tables(node, NODE_ATTRIBUTES) if _number(a, ATTR_TYPE, N.Int32Flags) == ATTR_INT}
            facts.nodes.append(Node(_string(node, NODE_OP_TYPE), _string(node, NODE_DOMAIN),
                                    tuple(_strings(node, NODE_INPUTS)), ints))
        for tensor in _tables(graph, GRAPH_INITIALIZERS):
            o = tensor.Offset(TENSOR_DIMS)
            dims = tuple(tensor.Get(N.Int64Flags, tensor.Vector(o) + 8 * j) for j in range(tensor.VectorLen(o))) \
                if o else ()
            elem = _number(tensor, TENSOR_TYPE, N.Int32Flags)
            name = _string(tensor, TENSOR_NAME)
            facts.initializers[name] = Initializer(name, dims, ELEM_TYPES.get(elem, f"type {elem}"), None)
        types = {}
        for arg in _tables(graph, GRAPH_NODE_ARGS):
            info = _table(arg, VALUE_TYPE)
            tensor = _table(info, TYPE_VALUE) if info else None
            elem = _number(tensor, TENSOR_ELEM_TYPE, N.Int32Flags) if tensor else 0
            types[_string(arg, VALUE_NAME)] = ELEM_TYPES.get(elem, f"type {elem}")
        facts.input_types.update({n: types.get(n, "") for n in _strings(graph, GRAPH_INPUTS)
                                  if n not in facts.initializers})
        facts.output_types.update({n: types.get(n, "") for n in _strings(graph, GRAPH_OUTPUTS)})
    except (ValueError, IndexError, UnicodeDecodeError, OSError, struct.error) as e:  # struct: offsets past the end
        raise ModelDirError(f"{path}: not a readable ORT-format model ({type(e).__name__}: {e})") from None
    return facts


def unchecked() -> str:
    """What an ORT-format graph's claims leave unchecked (verify says it, as a warning)."""
    return ("the ORT format's initializers are folded by its converter: the recipe's per-weight claims "
            "(per_channel, reduce_range) are not checked on it")
