"""The recipe claims only the graph's numbers show (runtime/checks/recipe_claims.py): per_channel from one linear's
weight scales, reduce_range from its int8 weights' largest magnitude (63 is the 7-bit range's edge, 64 is past it),
accuracy_level from MatMulNBits. Tiny graphs written here with onnx.helper, read as load reads them; no model is
built or run."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gptedge.runtime.checks.recipe_claims import recipe_problems
from gptedge.runtime.modeldir.manifest import Manifest, ModelShape, Quantization
from gptedge.runtime.modeldir.onnx_wire import read_graph_facts

SHAPE = ModelShape("gpt2", 2, 4, 8, 100, 64)
SAYS = "gptedge.json says"


def write(d, nodes, arrays: dict) -> object:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])
    graph = helper.make_graph(nodes, "g", [x], [y], [numpy_helper.from_array(a, n) for n, a in arrays.items()])
    onnx.save(helper.make_model(graph), str(d / "model.onnx"))
    return read_graph_facts(d / "model.onnx")


def dynamic(d, weight, scale, op="MatMulIntegerToFloat", scale_type=np.float32):
    """One dynamic-quantized linear: its int8 weight (4 x 3) and scale (3 per channel, or 1)."""
    arrays = {"w": np.asarray(weight, np.int8), "s": np.asarray(scale, scale_type), "zp": np.zeros(1, np.int8)}
    if op == "MatMulIntegerToFloat":
        node = helper.make_node(op, ["xq", "w", "xs", "s", "xz", "zp"], ["y"], domain="com.microsoft")
    else:
        node = helper.make_node(op, ["x", "w", "s"], ["y"], domain="com.microsoft")
    return write(d, [node], arrays)


def problems(d, facts, **recipe) -> list[str]:
    q = Quantization(**{"method": "dynamic", **recipe})
    return recipe_problems(d, d / "model.onnx", Manifest(SHAPE, precision="int8", quantization=q), facts)


def weight(largest: int) -> np.ndarray:
    w = np.zeros((4, 3), np.int8)
    w[0] = [largest, -largest // 2, 1]
    w[3, 2] = -largest
    return w


@pytest.mark.parametrize("op", ["MatMulIntegerToFloat", "DynamicQuantizeMatMul"])
def test_a_dynamic_linear_as_recorded_has_no_problem(tmp_path, op):
    facts = dynamic(tmp_path, weight(63), [0.1, 0.2, 0.3], op)
    assert problems(tmp_path, facts, per_channel=True, reduce_range=True) == []
    facts = dynamic(tmp_path, weight(127), [0.1], op)
    assert problems(tmp_path, facts, per_channel=False, reduce_range=False) == []
    assert problems(tmp_path, facts, per_channel=True, reduce_range=True) == [
        f"{SAYS} per_channel true, the graph's w has one scale for all its output channels",
        f"{SAYS} reduce_range true, the graph's w reaches 127 (past the 7-bit range -63..63)"]


def test_ops_before_the_first_quantized_linear_are_passed_over(tmp_path):
    nodes = [helper.make_node("Gather", ["emb", "x"], ["e"]), helper.make_node("LayerNormalization", ["e"], ["n"]),
             helper.make_node("MatMulIntegerToFloat", ["xq", "w", "xs", "s"], ["y"], domain="com.microsoft")]
    facts = write(tmp_path, nodes, {"emb": np.ones((5, 4), np.float32), "w": weight(127),
                                    "s": np.array([0.1], np.float32)})
    assert problems(tmp_path, facts, per_channel=False, reduce_range=True) == [
        f"{SAYS} reduce_range true, the graph's w reaches 127 (past the 7-bit range -63..63)"]


@pytest.mark.parametrize("largest, reduced", [(63, True), (64, False), (127, False), (1, True)])
def test_reduce_range_at_the_7_bit_edge_on_both_sides(tmp_path, largest, reduced):
    facts = dynamic(tmp_path, weight(largest), [0.1, 0.2, 0.3])
    assert problems(tmp_path, facts, reduce_range=reduced) == []
    where = "within" if reduced else "past"
    assert problems(tmp_path, facts, reduce_range=not reduced) == [
        f"{SAYS} reduce_range {str(not reduced).lower()}, the graph's w reaches {largest} ({where} the 7-bit range "
        "-63..63)"]


def test_reduce_range_reads_the_largest_magnitude_negative_too(tmp_path):
    w = np.zeros((4, 3), np.int8)
    w[1, 1] = -128  # int8's -128 has no positive twin: read as 128 through int16, not as -128
    facts = dynamic(tmp_path, w, [0.1, 0.2, 0.3])
    assert problems(tmp_path, facts, reduce_range=True) == [
        f"{SAYS} reduce_range true, the graph's w reaches 128 (past the 7-bit range -63..63)"]


def test_per_channel_from_the_scales(tmp_path):
    facts = dynamic(tmp_path, weight(63), [0.1, 0.2, 0.3])
    assert problems(tmp_path, facts, per_channel=False) == [
        f"{SAYS} per_channel false, the graph's w has 3 different scales over its 3 output channels"]
    facts = dynamic(tmp_path, weight(63), [0.1, 0.1, 0.1])  # stored per channel, all equal: one scale
    assert problems(tmp_path, facts, per_channel=True) == [
        f"{SAYS} per_channel true, the graph's w has one scale for all its output channels"]
    facts = dynamic(tmp_path, weight(63), [0.1, 0.1, 0.2])
    assert problems(tmp_path, facts, per_channel=False) == [
        f"{SAYS} per_channel false, the graph's w has 2 different scales over its 3 output channels"]


def test_both_claims_wrong_are_two_lines(tmp_path):
    facts = dynamic(tmp_path, weight(100), [0.5])
    assert [p.split(",")[0] for p in problems(tmp_path, facts, per_channel=True, reduce_range=True)] == [
        f"{SAYS} per_channel true", f"{SAYS} reduce_range true"]


def test_a_static_linear_reads_the_dequantize_of_an_int8_weight(tmp_path):
    arrays = {"w": weight(127), "s": np.array([0.1, 0.2, 0.3], np.float32), "zp": np.zeros(3, np.int8),
              "f": np.ones((4, 3), np.float32), "fs": np.ones(1, np.float32)}
    nodes = [helper.make_node("DequantizeLinear", ["f", "fs"], ["fd"]),  # not an int8 weight: skipped
             helper.make_node("DequantizeLinear", ["xq"], ["xd"]),  # too few inputs: skipped
             helper.make_node("DequantizeLinear", ["w", "s", "zp"], ["wd"]),
             helper.make_node("MatMul", ["x", "wd"], ["y"])]
    facts = write(tmp_path, nodes, arrays)
    assert problems(tmp_path, facts, method="static", per_channel=True) == []
    # reduce_range is not a static recipe's: a full-range weight is not a problem whatever it says
    assert problems(tmp_path, facts, method="static", per_channel=True, reduce_range=True) == []
    assert problems(tmp_path, facts, method="static", per_channel=False) == [
        f"{SAYS} per_channel false, the graph's w has 3 different scales over its 3 output channels"]
    # the dynamic check does not read a static graph's DequantizeLinear
    assert problems(tmp_path, facts, method="dynamic", per_channel=False) == []


def test_a_weight_or_scale_that_is_not_an_initializer_is_not_evidence(tmp_path):
    node = helper.make_node("MatMulIntegerToFloat", ["xq", "w", "xs", "s_in"], ["y"], domain="com.microsoft")
    facts = write(tmp_path, [node], {"w": weight(127)})
    assert problems(tmp_path, facts, per_channel=False, reduce_range=True) == []
    node = helper.make_node("MatMulIntegerToFloat", ["xq", "w_in", "xs", "s"], ["y"], domain="com.microsoft")
    facts = write(tmp_path, [node], {"s": np.array([0.1, 0.2, 0.3], np.float32)})
    assert problems(tmp_path, facts, per_channel=False) == []
    # a uint8 weight (not what quantize writes) is not read either
    node = helper.make_node("MatMulIntegerToFloat", ["xq", "w", "xs", "s"], ["y"], domain="com.microsoft")
    facts = write(tmp_path, [node], {"w": np.full((4, 3), 200, np.uint8), "s": np.array([0.1], np.float32)})
    assert problems(tmp_path, facts, per_channel=True) == []


def test_the_first_quantized_linear_is_the_evidence(tmp_path):
    nodes = [helper.make_node("MatMulIntegerToFloat", ["xq", "w1", "xs", "s1"], ["h"], domain="com.microsoft"),
             helper.make_node("MatMulIntegerToFloat", ["h", "w2", "xs", "s2"], ["y"], domain="com.microsoft")]
    facts = write(tmp_path, nodes, {"w1": weight(63), "s1": np.array([0.1, 0.2, 0.3], np.float32),
                                    "w2": weight(127), "s2": np.array([0.1], np.float32)})
    assert problems(tmp_path, facts, per_channel=True, reduce_range=True) == []


def test_ort_format_values_are_not_read_and_other_methods_are_not_checked(tmp_path):
    facts = dynamic(tmp_path, weight(127), [0.1])
    wrong = Quantization(method="dynamic", per_channel=True, reduce_range=True)
    m = Manifest(SHAPE, precision="int8", quantization=wrong)
    assert len(recipe_problems(tmp_path, tmp_path / "model.onnx", m, facts)) == 2
    assert recipe_problems(tmp_path, tmp_path / "model.onnx", m, facts, values=False) == []
    assert recipe_problems(tmp_path, tmp_path / "model.onnx", Manifest(SHAPE), facts) == []  # not quantized
    fp16 = Manifest(SHAPE, precision="fp16", quantization=Quantization(method="fp16", bits=16))
    assert recipe_problems(tmp_path, tmp_path / "model.onnx", fp16, facts) == []


def nbits(d, levels) -> object:
    nodes = [helper.make_node("MatMulNBits", ["x", f"w{i}", f"s{i}"], [f"y{i}"], domain="com.microsoft",
                              K=4, N=3, bits=4, block_size=32, **({} if level is None else {"accuracy_level": level}))
             for i, level in enumerate(levels)]
    return write(d, nodes, {})


@pytest.mark.parametrize("levels, claimed, says", [
    ([4, 4], 4, None), ([0], 0, None), ([None], 0, None), ([None], 4, "0"), ([4, 0], 4, "0, 4"), ([1], 4, "1")])
def test_accuracy_level_on_every_matmul_nbits(tmp_path, levels, claimed, says):
    facts = nbits(tmp_path, levels)
    q = Quantization(method="weight-only", bits=4, accuracy_level=claimed)
    found = recipe_problems(tmp_path, tmp_path / "model.onnx", Manifest(SHAPE, precision="int4", quantization=q), facts)
    assert found == ([] if says is None else [
        f"{SAYS} accuracy_level {claimed}, the graph's MatMulNBits compute at accuracy level {says}"])
    # accuracy_level is an attribute: an ORT-format graph keeps it, so it is checked there too
    assert recipe_problems(tmp_path, tmp_path / "model.onnx", Manifest(SHAPE, precision="int4", quantization=q),
                           facts, values=False) == found


def test_a_weight_only_graph_without_matmul_nbits_has_no_level_to_check(tmp_path):
    facts = write(tmp_path, [helper.make_node("MatMul", ["x", "w"], ["y"])], {"w": np.ones((4, 3), np.float32)})
    q = Quantization(method="weight-only", bits=4, accuracy_level=0)
    assert recipe_problems(tmp_path, tmp_path / "model.onnx", Manifest(SHAPE, precision="int4", quantization=q),
                           facts) == []
