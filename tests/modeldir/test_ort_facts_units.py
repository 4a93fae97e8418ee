"""An ORT-format graph's facts (runtime/checks/ort_facts.py) equal the facts onnx_wire reads from the model.onnx it
was converted from: nodes (op types, domains, inputs, integer attributes), initializers (dims, element types),
input and output types, producer. A tiny graph is converted here by ONNX Runtime itself (optimizations off, so the
two hold the same nodes); the mobile pack's end-to-end tests convert real models."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gptedge.runtime.checks.ort_facts import read_ort_facts, unchecked
from gptedge.runtime.errors import ModelDirError
from gptedge.runtime.modeldir.onnx_wire import is_ort_format, read_graph_facts


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    """(model.onnx, model.ort) of one tiny graph: float32 and int64 inputs, a float16 output, int attributes."""
    d = tmp_path_factory.mktemp("ort-facts")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 2])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 3])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Softmax", ["h"], ["z"], axis=1),
             helper.make_node("Gelu", ["z"], ["g"], domain="com.microsoft"),
             helper.make_node("Gather", ["g", "ids"], ["gathered"], axis=1),
             helper.make_node("Cast", ["gathered"], ["y"], to=TensorProto.FLOAT16)]
    inits = [numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "w"),
             numpy_helper.from_array(np.array([1, 2], np.int64), "unused_i64")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x, ids], [y, z], inits), producer_name="tiny-test",
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    onnx.save(model, str(d / "model.onnx"))
    return d / "model.onnx", save_ort(d / "model.onnx", d / "model.ort")


def save_ort(onnx_path, ort_path):
    """The graph at onnx_path as ONNX Runtime writes it in its ORT format (no optimization) -> ort_path."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.optimized_model_filepath = str(ort_path)
    so.add_session_config_entry("session.save_model_format", "ORT")
    ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
    return ort_path


def test_the_ort_graph_has_the_facts_of_its_onnx(graphs):
    onnx_path, ort_path = graphs
    assert is_ort_format(ort_path) and not is_ort_format(onnx_path)
    want, got = read_graph_facts(onnx_path), read_ort_facts(ort_path)
    assert got.producer == "onnxruntime" or got.producer == want.producer  # the converter may sign it
    assert got.producer
    assert [(n.op_type, n.domain, n.inputs) for n in got.nodes] == [(n.op_type, n.domain, n.inputs) for n in want.nodes]
    assert [n.ints for n in got.nodes] == [{}, {"axis": 1}, {}, {"axis": 1}, {"to": TensorProto.FLOAT16}]
    assert got.nodes[2].domain == "com.microsoft"
    assert {k: (i.dims, i.elem_type, i.location) for k, i in got.initializers.items() if k == "w"} == {
        "w": ((4, 3), "float32", None)}
    assert got.input_types == {"x": "float32", "ids": "int64"} == {k: v for k, v in want.input_types.items()}
    assert got.output_types == {"y": "float16", "z": "float32"} == want.output_types
    assert got.ops["MatMul"] == 1 and got.ops["Gelu"] == 1 and got.ops["LayerNormalization"] == 0


def test_an_initializer_is_not_an_input(graphs, tmp_path):
    """A graph input that is also an initializer (older exporters list weights among inputs) is not a graph input."""
    model = onnx.load(str(graphs[0]))
    model.ir_version = 8
    model.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 3]))
    onnx.save(model, str(tmp_path / "m.onnx"))
    save_ort(tmp_path / "m.onnx", tmp_path / "m.ort")
    facts = read_ort_facts(tmp_path / "m.ort")
    assert "w" in facts.initializers and set(facts.input_types) == {"x", "ids"}


@pytest.mark.parametrize("content", [b"", b"\x00" * 3, b"\x08\x00\x00\x00ORTM" + b"\xff" * 8, b"not a model at all"])
def test_bytes_that_are_not_an_ort_model_are_one_line(tmp_path, content):
    (tmp_path / "model.ort").write_bytes(content)
    with pytest.raises(ModelDirError, match=r"model\.ort: not a readable ORT-format model \(\w+"):
        read_ort_facts(tmp_path / "model.ort")


def test_a_truncated_ort_model_is_one_line(graphs, tmp_path):
    raw = graphs[1].read_bytes()
    (tmp_path / "cut.ort").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ModelDirError, match=r"cut\.ort: not a readable ORT-format model"):
        read_ort_facts(tmp_path / "cut.ort")
    with pytest.raises(ModelDirError, match=r"absent\.ort: not a readable ORT-format model \(FileNotFoundError"):
        read_ort_facts(tmp_path / "absent.ort")


def test_what_it_cannot_check_is_said():
    assert unchecked() == ("the ORT format's initializers are folded by its converter: the recipe's per-weight "
                           "claims (per_channel, reduce_range) are not checked on it")


def test_names_that_are_not_utf8_are_read_with_replacement_characters(graphs, tmp_path):
    raw = graphs[1].read_bytes()
    assert b"ids" in raw
    (tmp_path / "odd.ort").write_bytes(raw.replace(b"ids", b"i\xffs"))  # same length: every offset still holds
    facts = read_ort_facts(tmp_path / "odd.ort")
    assert facts.input_types == {"x": "float32", "i\ufffds": "int64"}
    assert facts.nodes[3].inputs == ("g", "i\ufffds")
