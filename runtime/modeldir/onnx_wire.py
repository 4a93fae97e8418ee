"""What a model.onnx holds, read straight from its protobuf bytes: the runtime has no `onnx` package.

Only the facts the manifest's claims are checked against (model_claims.py) are read: every node's
op type, domain and integer attributes, every initializer's name, dims, element type and external
data location, the graph's input and output element types, and the producer. Weights are skipped
unread (the file is memory-mapped, and a length-delimited field is stepped over), so reading GPT-2
small's 130 MB inline graph touches a few KB of it.

Field numbers are onnx.proto's (ModelProto.graph = 7, GraphProto.node = 1, ...); both packed and
unpacked encodings of repeated integers are accepted, as protobuf parsers must.
"""

from __future__ import annotations

import mmap
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ModelDirError

# ONNX TensorProto.DataType values the checks name
ELEM_TYPES = {1: "float32", 2: "uint8", 3: "int8", 6: "int32", 7: "int64", 10: "float16", 11: "float64", 16: "bfloat16"}
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


class WireError(ValueError):
    """The bytes are not a well-formed protobuf message."""


def _varint(buf, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise WireError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def fields(buf, start: int = 0, end: int | None = None) -> Iterator[tuple[int, int, object]]:
    """(field number, wire type, value) of one message: value is an int for varints and fixed-size
    fields, a (start, end) span for length-delimited ones."""
    pos, end = start, len(buf) if end is None else end
    while pos < end:
        key, pos = _varint(buf, pos)
        number, kind = key >> 3, key & 7
        if kind == _VARINT:
            value, pos = _varint(buf, pos)
        elif kind == _LEN:
            length, pos = _varint(buf, pos)
            if pos + length > end:
                raise WireError(f"field {number} runs past its message")
            value, pos = (pos, pos + length), pos + length
        elif kind in (_I64, _I32):
            size = 8 if kind == _I64 else 4
            value, pos = int.from_bytes(buf[pos:pos + size], "little"), pos + size
        else:
            raise WireError(f"wire type {kind} is not supported")
        yield number, kind, value


def _text(buf, span) -> str:
    return bytes(buf[span[0]:span[1]]).decode("utf-8", "replace")


def _ints(buf, kind: int, value) -> list[int]:
    """A repeated int64 field's value(s): one varint, or a packed run of them."""
    if kind == _VARINT:
        return [value - (1 << 64) if value >= 1 << 63 else value]
    out, pos = [], value[0]
    while pos < value[1]:
        v, pos = _varint(buf, pos)
        out.append(v - (1 << 64) if v >= 1 << 63 else v)
    return out


@dataclass(frozen=True)
class Node:
    op_type: str
    domain: str
    inputs: tuple[str, ...]
    ints: dict[str, int]  # integer attributes (MatMulNBits' bits and block_size, ...)


@dataclass(frozen=True)
class Initializer:
    name: str
    dims: tuple[int, ...]
    elem_type: str
    location: str | None  # external data file, relative to the graph's dir; None when inline


@dataclass
class GraphFacts:
    producer: str = ""
    nodes: list[Node] = field(default_factory=list)
    initializers: dict[str, Initializer] = field(default_factory=dict)
    input_types: dict[str, str] = field(default_factory=dict)
    output_types: dict[str, str] = field(default_factory=dict)

    @property
    def ops(self) -> Counter:
        return Counter(n.op_type for n in self.nodes)

    @property
    def external_files(self) -> list[str]:
        return sorted({i.location for i in self.initializers.values() if i.location is not None})


def _node(buf, span) -> Node:
    op, domain, inputs, ints = "", "", [], {}
    for number, _, value in fields(buf, *span):
        if number == 1:
            inputs.append(_text(buf, value))
        elif number == 4:
            op = _text(buf, value)
        elif number == 7:
            domain = _text(buf, value)
        elif number == 5:  # AttributeProto: name = 1, i = 3
            name, i = "", None
            for n, _, v in fields(buf, *value):
                if n == 1:
                    name = _text(buf, v)
                elif n == 3:
                    i = _ints(buf, _VARINT, v)[0]
            if i is not None:
                ints[name] = i
    return Node(op, domain, tuple(inputs), ints)


def _initializer(buf, span) -> Initializer:
    name, dims, elem, external, entries = "", [], 0, False, {}
    for number, kind, value in fields(buf, *span):
        if number == 1:
            dims += _ints(buf, kind, value)
        elif number == 2:
            elem = value
        elif number == 8:
            name = _text(buf, value)
        elif number == 14:
            external = value == 1
        elif number == 13:  # StringStringEntryProto: key = 1, value = 2
            kv = {n: _text(buf, v) for n, _, v in fields(buf, *value)}
            entries[kv.get(1, "")] = kv.get(2, "")
    return Initializer(name, tuple(dims), ELEM_TYPES.get(elem, f"type {elem}"),
                       entries.get("location") if external else None)


def _value_type(buf, span) -> tuple[str, str]:
    """ValueInfoProto -> (name, element type); TypeProto.tensor_type = 1, its elem_type = 1."""
    name, elem = "", 0
    for number, _, value in fields(buf, *span):
        if number == 1:
            name = _text(buf, value)
        elif number == 2:
            for n, _, v in fields(buf, *value):
                if n == 1:
                    elem = next((x for k, _, x in fields(buf, *v) if k == 1), 0)
    return name, ELEM_TYPES.get(elem, f"type {elem}")


def is_ort_format(path: str | Path) -> bool:
    """An ORT-format model (`gptedge pack --target mobile`'s model.ort): a flatbuffer whose file identifier,
    bytes 4..8, is 'ORTM'. Its graph is not protobuf: read_graph_facts cannot read it."""
    try:
        with open(path, "rb") as f:
            return f.read(8)[4:8] == b"ORTM"
    except OSError:
        return False


def read_graph_facts(path: str | Path) -> GraphFacts:
    """The facts of the graph file at `path`; ModelDirError naming it when it is not an ONNX model."""
    facts = GraphFacts()
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            graph = None
            for number, _, value in fields(buf):
                if number == 2:
                    facts.producer = _text(buf, value)
                elif number == 7:
                    graph = value
            if graph is None:
                raise WireError("no graph")
            for number, _, value in fields(buf, *graph):
                if number == 1:
                    facts.nodes.append(_node(buf, value))
                elif number == 5:
                    t = _initializer(buf, value)
                    facts.initializers[t.name] = t
                elif number in (11, 12):
                    name, elem = _value_type(buf, value)
                    (facts.input_types if number == 11 else facts.output_types)[name] = elem
    except (WireError, ValueError, OSError) as e:
        raise ModelDirError(f"{path}: not an ONNX model ({e})") from None
    return facts


def encode_varint(n: int) -> bytes:
    """A non-negative int as a protobuf varint (what argmax_graph writes its fields with too)."""
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _spans(buf, start: int, end: int) -> Iterator[tuple[int, int, int, object]]:
    """(field number, the field's first byte (its key), the byte after it, its value) of one message."""
    pos = start
    for number, kind, value in fields(buf, start, end):
        key_start = pos
        pos = value[1] if kind == _LEN else _skip(buf, pos, kind)
        yield number, key_start, pos, value


def _skip(buf, pos: int, kind: int) -> int:
    _, pos = _varint(buf, pos)  # the key
    if kind == _VARINT:
        return _varint(buf, pos)[1]
    return pos + (8 if kind == _I64 else 4)


def _graph(model: bytes) -> tuple[int, int, int, int]:
    """Where a serialized ModelProto's graph (ModelProto.graph = 7) lies -> (its field's start, end, its body's start,
    end)."""
    graph = next(((key, end, value) for number, key, end, value in _spans(model, 0, len(model)) if number == 7), None)
    if graph is None:
        raise WireError("no graph")
    key, end, (body_start, body_end) = graph
    return key, end, body_start, body_end


def _with_graph_body(model: bytes, key: int, end: int, body: bytes) -> bytes:
    """The model with its graph field (model[key:end]) holding `body` instead; everything else byte for byte."""
    return model[:key] + encode_varint(7 << 3 | _LEN) + encode_varint(len(body)) + body + model[end:]


def with_graph_fields(model: bytes, fields_: bytes) -> bytes:
    """The serialized ModelProto with serialized GraphProto fields appended to its graph (a node lands after every
    other node, an output after the others); everything else byte for byte."""
    key, end, body_start, body_end = _graph(model)
    return _with_graph_body(model, key, end, model[body_start:body_end] + fields_)


def without_graph_input(model: bytes, name: str) -> bytes:
    """The serialized ModelProto with `name` taken out of the graph's inputs (GraphProto.input = 11); everything else
    byte for byte. An input that is also an initializer then is a constant (runtime/graphs/cuda_graph.py says why)."""
    key, end, body_start, body_end = _graph(model)
    kept, dropped = [], 0
    for number, start, stop, value in _spans(model, body_start, body_end):
        if number == 11 and any(n == 1 and _text(model, v) == name for n, _, v in fields(model, *value)):
            dropped += 1
            continue
        kept.append(model[start:stop])
    if not dropped:
        raise WireError(f"the graph has no input {name!r}")
    return _with_graph_body(model, key, end, b"".join(kept))
