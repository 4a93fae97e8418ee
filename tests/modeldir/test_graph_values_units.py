"""Initializer values read from a model.onnx's protobuf wire (runtime/checks/graph_values.py) equal what the `onnx`
package reads, in every storage a graph uses: raw_data, the typed repeated fields (float_data, int32_data for
int8 / uint8 / float16, int64_data with negative numbers), packed or not, and a span of an external data file.
Tiny graphs written here with onnx.helper; no model is built."""

from __future__ import annotations

import struct

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gptedge.runtime.checks.graph_values import read_initializers
from gptedge.runtime.errors import ModelDirError
from gptedge.runtime.modeldir.onnx_wire import encode_varint

RNG = np.random.default_rng(3)
ARRAYS = {
    "f32_raw": RNG.standard_normal((3, 4)).astype(np.float32),
    "i8_raw": np.array([[-128, -1, 0], [1, 63, 127]], np.int8),
    "u8_raw": np.array([0, 7, 255], np.uint8),
    "f16_raw": np.array([1.5, -2.25, 65504.0], np.float16),
    "i64_raw": np.array([-5, 0, 1 << 40], np.int64),
    "i32_raw": np.array([[-(1 << 31), 0], [1, (1 << 31) - 1]], np.int32),
}


def typed(name: str, elem: int, dims, values, field: str) -> TensorProto:
    t = TensorProto(name=name, data_type=elem, dims=dims)
    getattr(t, field).extend(values)
    return t


def write_graph(path, initializers: list[TensorProto]) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], initializers)
    onnx.save(helper.make_model(graph), str(path))


def test_raw_data_of_every_type_reads_as_onnx_reads_it(tmp_path):
    write_graph(tmp_path / "model.onnx", [numpy_helper.from_array(a, n) for n, a in ARRAYS.items()])
    found = read_initializers(tmp_path, tmp_path / "model.onnx", set(ARRAYS))
    assert set(found) == set(ARRAYS)
    for name, array in ARRAYS.items():
        assert found[name].dtype == array.dtype and found[name].shape == array.shape, name
        np.testing.assert_array_equal(found[name], array)


def test_only_the_names_asked_for_are_read(tmp_path):
    write_graph(tmp_path / "model.onnx", [numpy_helper.from_array(a, n) for n, a in ARRAYS.items()])
    found = read_initializers(tmp_path, tmp_path / "model.onnx", {"i8_raw", "absent"})
    assert list(found) == ["i8_raw"]
    assert read_initializers(tmp_path, tmp_path / "model.onnx", set()) == {}


def test_the_typed_fields_read_as_onnx_reads_them(tmp_path):
    scales = [0.5, -0.25, 3.0e-3]
    tensors = [
        typed("f", TensorProto.FLOAT, [3], scales, "float_data"),
        typed("i8", TensorProto.INT8, [2, 2], [-128, -1, 0, 127], "int32_data"),
        typed("u8", TensorProto.UINT8, [3], [0, 200, 255], "int32_data"),
        typed("i64", TensorProto.INT64, [3], [-7, 0, 1 << 50], "int64_data"),
        typed("i32", TensorProto.INT32, [2], [-(1 << 31), 5], "int32_data"),
        typed("one", TensorProto.FLOAT, [], [2.5], "float_data"),  # a scalar: dims ()
    ]
    write_graph(tmp_path / "model.onnx", tensors)
    found = read_initializers(tmp_path, tmp_path / "model.onnx", {t.name for t in tensors})
    for t in tensors:
        want = numpy_helper.to_array(t)
        assert found[t.name].dtype == want.dtype and found[t.name].shape == want.shape, t.name
        np.testing.assert_array_equal(found[t.name], want)


def test_unpacked_typed_fields_read_one_element_each(tmp_path):
    """proto3 writes repeated numbers packed; a writer that writes one field per element must read the same. The
    model is written by hand: a graph (field 7) of initializers (5), each a name (8), dims (1), type (2) and its
    values one field each (int32_data = 5 as varints, float_data = 4 as fixed 32-bit)."""
    def tensor(name: str, elem: int, number: int, wire: int, values) -> bytes:
        body = _len_field(8, name.encode()) + _varint(1 << 3) + _varint(len(values)) + _varint(2 << 3) + _varint(elem)
        for v in values:
            body += _varint(number << 3 | wire) + (_varint(v) if wire == 0 else struct.pack("<f", v))
        return _len_field(5, body)

    graph = (tensor("i8", TensorProto.INT8, 5, 0, [-3, 9, 0]) + tensor("f", TensorProto.FLOAT, 4, 5, [1.25, -8.0])
             + tensor("i64", TensorProto.INT64, 7, 0, [-(1 << 40), 2]))
    (tmp_path / "model.onnx").write_bytes(_varint(1 << 3) + _varint(8) + _len_field(7, graph))
    found = read_initializers(tmp_path, tmp_path / "model.onnx", {"i8", "f", "i64"})
    np.testing.assert_array_equal(found["i8"], np.array([-3, 9, 0], np.int8))
    np.testing.assert_array_equal(found["f"], np.array([1.25, -8.0], np.float32))
    np.testing.assert_array_equal(found["i64"], np.array([-(1 << 40), 2], np.int64))


def _varint(n: int) -> bytes:
    return encode_varint(n & ((1 << 64) - 1))  # negative numbers as protobuf writes them: 64-bit two's complement


def _len_field(number: int, body: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(body)) + body


def test_external_data_is_read_from_its_span(tmp_path):
    arrays = {"w": np.arange(-60, 60, dtype=np.int8).reshape(10, 12), "s": np.linspace(0.1, 1, 12, dtype=np.float32)}
    model_path = tmp_path / "sub" / "model.onnx"
    model_path.parent.mkdir()
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
                              [numpy_helper.from_array(a, n) for n, a in arrays.items()])
    onnx.save(helper.make_model(graph), str(model_path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)
    assert (model_path.parent / "weights.bin").stat().st_size > 0
    found = read_initializers(tmp_path, model_path, {"w", "s"})
    np.testing.assert_array_equal(found["w"], arrays["w"])
    np.testing.assert_array_equal(found["s"], arrays["s"])
    assert found["w"].shape == (10, 12)


def test_external_data_outside_the_dir_and_unreadable_graphs_are_one_line(tmp_path):
    t = numpy_helper.from_array(np.ones(4, np.float32), "w")
    t.data_location = TensorProto.EXTERNAL
    t.ClearField("raw_data")
    for key, value in (("location", "../evil.bin"), ("offset", "0"), ("length", "16")):
        t.external_data.add(key=key, value=value)
    write_graph(tmp_path / "model.onnx", [t])
    with pytest.raises(ModelDirError, match="is not a plain path inside the model directory"):
        read_initializers(tmp_path, tmp_path / "model.onnx", {"w"})
    (tmp_path / "bad.onnx").write_bytes(b"\x3a\xff\xff\xff")  # a graph field whose length runs past the end
    with pytest.raises(ModelDirError, match=r"bad.onnx: cannot read its initializers \("):
        read_initializers(tmp_path, tmp_path / "bad.onnx", {"w"})
    (tmp_path / "nograph.onnx").write_bytes(onnx.ModelProto(ir_version=8).SerializeToString())
    with pytest.raises(ModelDirError, match=r"nograph.onnx: cannot read its initializers \(no graph\)"):
        read_initializers(tmp_path, tmp_path / "nograph.onnx", {"w"})


def test_a_type_it_does_not_read_is_left_out(tmp_path):
    write_graph(tmp_path / "model.onnx", [numpy_helper.from_array(np.ones(2, np.float64), "d"),
                                          numpy_helper.from_array(np.ones(2, np.float32), "f")])
    assert list(read_initializers(tmp_path, tmp_path / "model.onnx", {"d", "f"})) == ["f"]


def test_a_size_that_does_not_match_its_dims_is_returned_flat(tmp_path):
    t = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2, 3], raw_data=np.ones(4, np.float32).tobytes())
    write_graph(tmp_path / "model.onnx", [t])
    assert read_initializers(tmp_path, tmp_path / "model.onnx", {"w"})["w"].shape == (4,)
