"""benchmarks/byte_floor.py counts the bytes a decode step's linears read in ONNX Runtime's packed layout, and
huge_pages_ab.py --floor turns them into the tok/s a dir would reach with its linears at the streaming rate: the
figures behind "a faster kernel could give the 8-bit layout at most this much"."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from ..support.checkpoints import ROOT


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module


bf = _load("byte_floor")
hp = _load("huge_pages_ab")


def test_packed_bytes_add_a_scale_and_a_block_sum_to_every_block():
    assert bf.packed_bytes(576, 960, 8, 32) == 960 * 18 * 40  # Q8_0 would be 34 a block
    assert bf.packed_bytes(576, 960, 4, 64) == 960 * 9 * 40  # 32 bytes of nibbles + 8
    assert bf.packed_bytes(100, 2, 8, 32) == 2 * 4 * 40  # a partial last block is packed whole


def test_linear_bytes_counts_each_linear_kind_once():
    w = np.zeros((8, 4), np.float32)
    inits = [numpy_helper.from_array(np.zeros((4, 2, 32), np.uint8), "q"),
             numpy_helper.from_array(np.zeros(8, np.float32), "s"),
             numpy_helper.from_array(w, "w"),
             numpy_helper.from_array(np.zeros((1, 4, 4), np.float32), "rot"),  # a rotation, not a linear
             numpy_helper.from_array(np.zeros((4, 4), np.int8), "i8"),
             numpy_helper.from_array(np.ones(4, np.float32), "i8s")]
    nodes = [helper.make_node("MatMulNBits", ["x", "q", "s"], ["a"], domain="com.microsoft", K=64, N=4, bits=8,
                              block_size=32, accuracy_level=4),
             helper.make_node("MatMul", ["x8", "w"], ["b"]),
             helper.make_node("MatMul", ["x3", "rot"], ["c"]),
             helper.make_node("DynamicQuantizeMatMul", ["b", "i8", "i8s"], ["d"], domain="com.microsoft")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                                           for n in ("x", "x8", "x3")],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "acd"], inits)
    total, weights, skipped = bf.linear_bytes(helper.make_model(graph))
    assert weights == 64 * 4 + 8 * 4
    assert total == 4 * 2 * 40 + 8 * 4 * 4
    assert skipped == {"DynamicQuantizeMatMul": 1}


def test_floor_row_replaces_the_linears_time_and_keeps_the_rest(capsys):
    # step 10 ms, of which linears 8 ms; at the floor the linears take 6 ms: 8 ms a step, 125 tok/s
    rates = {"w8 huge pages off": [50.0, 50.0], "w8 huge pages on": [100.0, 100.0],
             "w8 linears alone": [125.0, 125.0],
             "w8 floor": [1000 / 6, 1000 / 6], "llama.cpp Q8_0": [100.0, 125.0]}
    hp.print_floors(rates)
    out = capsys.readouterr().out
    assert "w8 with its linears at the streaming rate: 125.0 tok/s" in out
    assert "1.12x llama.cpp Q8_0" in out  # the median of 1.25x and 1.00x, round by round
