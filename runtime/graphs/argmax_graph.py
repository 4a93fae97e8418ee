"""A one-node ONNX graph, logits (B, K, V) -> ArgMax -> token ids (B, K) int64, for picking greedy tokens
where the logits are (on the GPU), so only the ids cross to the host each step.

The runtime installs no `onnx` package (ONNX Runtime alone), so the few protobuf messages are written
by hand here; tests/quantize/test_fp16.py (test_argmax_graph_is_valid_onnx_and_matches_numpy) parses them with onnx,
checks them with its checker and runs them against numpy.
Field numbers are onnx.proto3's.
"""

from __future__ import annotations

from ..modeldir.onnx_wire import encode_varint

TOKEN_IDS = "token_ids"
LOGITS = "logits"
_INT64, _FLOAT, _FLOAT16 = 7, 1, 10  # TensorProto.DataType
OPSET = 13


def _field(number: int, payload: bytes | str | int) -> bytes:
    """One protobuf field: an int as a varint (wire type 0), bytes / str length-delimited (wire type 2)."""
    if isinstance(payload, int):
        return encode_varint(number << 3) + encode_varint(payload)
    data = payload.encode() if isinstance(payload, str) else payload
    return encode_varint(number << 3 | 2) + encode_varint(len(data)) + data


def _value_info(name: str, elem_type: int, dims: list[str]) -> bytes:
    shape = b"".join(_field(1, _field(2, d)) for d in dims)  # TensorShapeProto.dim { dim_param }
    tensor = _field(1, elem_type) + _field(2, shape)  # TypeProto.Tensor
    return _field(1, name) + _field(2, _field(1, tensor))  # ValueInfoProto { name, type { tensor_type } }


def argmax_node(logits: str, token_ids: str, name: str = "argmax") -> bytes:
    """A serialized NodeProto: token_ids (B, K) int64 = ArgMax of logits (B, K, V) over the last axis, the first index
    on ties (as numpy's argmax)."""
    axis = _field(1, "axis") + _field(20, 2) + _field(3, (1 << 64) - 1)  # INT attribute, -1 as two's complement
    keepdims = _field(1, "keepdims") + _field(20, 2) + _field(3, 0)
    return (_field(1, logits) + _field(2, token_ids) + _field(3, name) + _field(4, "ArgMax")
            + _field(5, axis) + _field(5, keepdims))


def int64_output(name: str) -> bytes:
    """A serialized ValueInfoProto: an int64 tensor of any shape (for a graph output)."""
    return _field(1, name) + _field(2, _field(1, _field(1, _INT64)))


def argmax_fields(logits: str, token_ids: str) -> bytes:
    """Serialized GraphProto fields to append to a graph (onnx_wire.with_graph_fields): the ArgMax node over its
    `logits` and a graph output `token_ids`."""
    return _field(1, argmax_node(logits, token_ids, token_ids)) + _field(12, int64_output(token_ids))


def argmax_model(logits_float16: bool = False) -> bytes:
    """Serialized ModelProto: ArgMax over the last axis, first index on ties (as numpy's argmax)."""
    node = argmax_node(LOGITS, TOKEN_IDS)
    graph = (_field(1, node) + _field(2, "gptedge_argmax")
             + _field(11, _value_info(LOGITS, _FLOAT16 if logits_float16 else _FLOAT, ["batch", "keep", "vocab"]))
             + _field(12, _value_info(TOKEN_IDS, _INT64, ["batch", "keep"])))
    opset = _field(1, "") + _field(2, OPSET)
    return _field(1, 8) + _field(2, "gptedge") + _field(7, graph) + _field(8, opset)  # ir_version 8
