"""The values of a few initializers of a model.onnx, read from the protobuf wire without the `onnx` package.

model_claims' recipe checks need to see numbers, not only ops: whether one linear's int8 weights use the 7-bit
range (reduce_range) and whether its scales differ per output channel (per_channel). Only the tensors asked for
are read (inline raw_data, the typed repeated fields, or their span of the external data file), so a check reads
one linear's weights, not the model.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

from ..errors import ModelDirError
from ..modeldir.model_files import confined
from ..modeldir.onnx_wire import WireError, _varint, fields

# TensorProto.DataType -> numpy dtype name (the types quantized graphs store weights and scales in)
_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 6: "int32", 7: "int64", 10: "float16"}


def _typed_values(buf, value, elem: int) -> list:
    """A repeated typed field's values (float_data = 4 for float32, else int32_data = 5 / int64_data = 7), packed
    (a span) or one unpacked element (a number)."""
    if elem == 1:
        raw = bytes(buf[value[0]:value[1]]) if isinstance(value, tuple) else struct.pack("<I", value)
        return list(struct.unpack(f"<{len(raw) // 4}f", raw))
    out, pos = [], value[0] if isinstance(value, tuple) else 0
    if not isinstance(value, tuple):
        out.append(value)
    while isinstance(value, tuple) and pos < value[1]:
        v, pos = _varint(buf, pos)
        out.append(v)
    return [v - (1 << 64) if v >= 1 << 63 else v for v in out]  # varints of negative numbers are 64-bit


def read_initializers(model_dir: Path, graph: Path, names: set[str]):
    """{name: numpy array} for the initializers of `graph` named in `names` (those it holds; the rest absent)."""
    import numpy as np

    found = {}
    with open(graph, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        try:
            top = next((v for n, _, v in fields(buf) if n == 7), None)
            if top is None:
                raise WireError("no graph")
            for number, _, value in fields(buf, *top):
                if number != 5:
                    continue
                name, dims, elem, raw, typed, entries, external = "", [], 0, None, [], {}, False
                for n, kind, v in fields(buf, *value):
                    if n == 8:
                        name = bytes(buf[v[0]:v[1]]).decode("utf-8", "replace")
                    elif n == 1:
                        dims.append(v)
                    elif n == 2:
                        elem = v
                    elif n == 9:
                        raw = v
                    elif n in (4, 5, 7):
                        typed.append((v, kind))
                    elif n == 14:
                        external = v == 1
                    elif n == 13:
                        kv = {k: bytes(buf[x[0]:x[1]]).decode() for k, _, x in fields(buf, *v)}
                        entries[kv.get(1, "")] = kv.get(2, "")
                if name not in names or elem not in _DTYPES:
                    continue
                dtype = np.dtype(_DTYPES[elem])
                if external:
                    data = confined(model_dir, (Path(graph).parent.relative_to(model_dir) / entries["location"])
                                    .as_posix(), "external data")
                    offset, length = int(entries.get("offset", 0)), entries.get("length")
                    with open(data, "rb") as d:
                        d.seek(offset)
                        array = np.frombuffer(d.read(int(length) if length else -1), dtype)
                elif raw is not None:
                    array = np.frombuffer(bytes(buf[raw[0]:raw[1]]), dtype)
                else:
                    array = np.array([x for span, _ in typed for x in _typed_values(buf, span, elem)],
                                     dtype)
                found[name] = array.reshape(dims) if array.size == int(np.prod(dims or [1])) else array
        except (WireError, ValueError, KeyError, OSError) as e:
            raise ModelDirError(f"{graph}: cannot read its initializers ({e})") from None
    return found
