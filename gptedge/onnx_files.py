"""Graph files on disk (needs onnx; used by export and quantize, never by the runtime).

Weights go to `model.onnx.data` beside the graph once they pass EXTERNAL_DATA_THRESHOLD bytes:
ONNX Runtime memory-maps external data, so a session's peak RSS stays near the weights' size
(GPT-2 small fp32: 897 MB inline, 697 MB external), and protobuf's 2 GB limit never applies.

Big models never exist as one protobuf: `WeightSink` writes each tensor to the data file as it
is produced and hands back a TensorProto that only references it (export streams the weights
this way), and `read_initializer` reads one tensor back through a memory map, so a reader holds
one tensor at a time, not the model (quantize). Offsets are page-aligned (ALIGNMENT), as ONNX
Runtime wants them to map a tensor in place.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

EXTERNAL_DATA_THRESHOLD = 64 * 1024 * 1024
INLINE_LIMIT = 1024  # tensors smaller than this stay in the graph (onnx's size_threshold)
ALIGNMENT = 4096  # every external tensor starts on a page: memory-mappable where it lies


def data_file_name(model_path: Path) -> str:
    return Path(model_path).name + ".data"


def _inline(name: str, value: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(np.require(value, requirements="C"), name)


class WeightSink:
    """Turns arrays into initializers: inline in the graph, or (`external`) appended to the data file
    beside `model_path` at once, the TensorProto holding only its location. Close it (or use `with`)
    before the graph is read."""

    def __init__(self, model_path: Path | None = None, external: bool = False):
        if external and model_path is None:
            raise ValueError("an external-data sink needs the graph's path")
        self.location = data_file_name(model_path) if external else None
        # "xb": a sink never truncates a data file something else wrote
        self._file = open(Path(model_path).with_name(self.location), "xb") if external else None
        self.bytes_written = 0

    @classmethod
    def for_size(cls, model_path: Path, total_bytes: int) -> WeightSink:
        """External data when the weights pass EXTERNAL_DATA_THRESHOLD, as save_onnx decides."""
        return cls(model_path, external=total_bytes > EXTERNAL_DATA_THRESHOLD)

    @property
    def external(self) -> bool:
        return self._file is not None

    def tensor(self, name: str, value: np.ndarray) -> TensorProto:
        value = np.asarray(value)
        if self._file is None or value.nbytes < INLINE_LIMIT:
            return _inline(name, value)
        return self._write(name, np.require(value, requirements="C"))

    def proto(self, tensor: TensorProto) -> TensorProto:
        """An inline TensorProto moved to the data file (its raw bytes released); others as they are."""
        if self._file is None or not tensor.HasField("raw_data") or len(tensor.raw_data) < INLINE_LIMIT:
            return tensor
        offset = self._append(tensor.raw_data)
        length = len(tensor.raw_data)
        tensor.ClearField("raw_data")
        _reference(tensor, self.location, offset, length)
        return tensor

    def _write(self, name: str, value: np.ndarray) -> TensorProto:
        t = TensorProto(name=name, dims=value.shape, data_type=helper.np_dtype_to_tensor_dtype(value.dtype))
        if value.dtype.byteorder == ">":
            value = value.astype(value.dtype.newbyteorder("<"))
        offset = self._append(memoryview(value.reshape(-1).view(np.uint8)))
        _reference(t, self.location, offset, value.nbytes)
        return t

    def _append(self, data: bytes | memoryview) -> int:
        pad = -self.bytes_written % ALIGNMENT
        if pad:
            self._file.write(b"\0" * pad)
        offset = self.bytes_written + pad
        self._file.write(data)
        self.bytes_written = offset + memoryview(data).nbytes
        return offset

    def close(self) -> None:
        if self._file is not None and not self._file.closed:
            self._file.close()

    def __enter__(self) -> WeightSink:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _reference(t: TensorProto, location: str, offset: int, length: int) -> None:
    t.data_location = TensorProto.EXTERNAL
    del t.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = t.external_data.add()
        entry.key, entry.value = key, value


def save_onnx(model: onnx.ModelProto, path: Path) -> None:
    """model.onnx, with the weights moved to model.onnx.data when they pass EXTERNAL_DATA_THRESHOLD bytes
    (the model's inline tensors are emptied as they are written, so memory falls as the file grows).
    Tensors already external (written by a WeightSink beside `path`) stay where they are."""
    path = Path(path)
    size = sum(len(t.raw_data) for t in model.graph.initializer)
    movable = [t for t in model.graph.initializer if len(t.raw_data) >= INLINE_LIMIT]
    if size > EXTERNAL_DATA_THRESHOLD and movable:
        with WeightSink(path, external=True) as sink:
            for t in movable:
                sink.proto(t)
    onnx.save_model(model, str(path))


def external_data_path(model_path: Path) -> Path | None:
    data = Path(model_path).with_name(data_file_name(model_path))
    return data if data.exists() else None


def read_initializer(t: TensorProto, base_dir: Path | None) -> np.ndarray:
    """A tensor's value; external data is memory-mapped read-only (pages are read when touched and the
    map closes with the last array that uses it), so no copy of the file is held."""
    if t.data_location != TensorProto.EXTERNAL:
        return numpy_helper.to_array(t)
    if base_dir is None:
        raise ValueError(f"initializer {t.name!r} is stored in external data, but no directory was given")
    info = {e.key: e.value for e in t.external_data}
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).newbyteorder("<")
    shape = tuple(t.dims)
    count = int(np.prod(shape, dtype=np.int64))
    path = Path(base_dir) / info["location"]
    if Path(info["location"]).is_absolute() or ".." in Path(info["location"]).parts:
        raise ValueError(f"initializer {t.name!r}: external data outside the model directory ({info['location']})")
    if count == 0:
        return np.zeros(shape, dtype)
    offset = int(info.get("offset", 0))
    length = int(info.get("length", count * dtype.itemsize))
    if length != count * dtype.itemsize or offset + length > path.stat().st_size:
        raise ValueError(f"initializer {t.name!r}: {path.name} holds no {length} bytes at offset {offset}")
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape).view(np.ndarray)


class Initializers(Mapping[str, np.ndarray]):
    """A graph's initializers by name, read when asked: inline ones decoded once and kept, external ones
    mapped afresh on each access and never kept (so quantizing a model touches one tensor at a time)."""

    def __init__(self, model: onnx.ModelProto, base_dir: Path | None = None):
        self.base_dir = Path(base_dir) if base_dir is not None else None
        self.tensors = {t.name: t for t in model.graph.initializer}
        self._inline: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        t = self.tensors[name]
        if t.data_location == TensorProto.EXTERNAL:
            return read_initializer(t, self.base_dir)
        if name not in self._inline:
            self._inline[name] = numpy_helper.to_array(t)
        return self._inline[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.tensors[name].dims)

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    def inline_copy(self, name: str) -> TensorProto:
        """The initializer with its data in the proto (read from the file where external)."""
        t = self.tensors[name]
        if t.data_location != TensorProto.EXTERNAL:
            return t
        return _inline(name, read_initializer(t, self.base_dir))
