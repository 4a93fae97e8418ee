"""A small ONNX graph builder: nodes with unique names, weights by name, constants by value.

Constants are asked for by value (`g.f32(0.5)`, `g.i64([1])`), never by a name typed at the
use site: the same value is stored once, and a constant can't be misspelt into a graph that
only fails when ONNX Runtime loads it.

Weights go through a WeightSink (gptedge/onnx_files.py): inline for small models, or written to
the external-data file the moment they are added, so a big model's weights never sit in memory
as protobuf.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper

from gptedge.onnx_files import WeightSink

MS_DOMAIN = "com.microsoft"  # ONNX Runtime's contrib ops
FLOAT_MIN = float(np.finfo(np.float32).min)
Weights = dict[str, np.ndarray]  # reference parameter name -> float32 array: what a graph is written from


class GraphWriter:
    """Collects nodes and initializers with unique names."""

    def __init__(self, sink: WeightSink | None = None, opset: int = 17, contrib: bool = False) -> None:
        self.sink = sink or WeightSink()  # default: every initializer inline
        self.opset = opset  # the graph's ONNX opset: ops whose signature changed (Reduce* axes at 18) ask it
        # the graph is written with ONNX Runtime's contrib ops (its attention's kind): a family's norms may be too
        self.contrib = contrib
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0
        self._constants: dict[tuple[str, tuple[int, ...], bytes], str] = {}

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, name: str | None = None,
           outputs: list[str] | None = None, domain: str = "", **attrs) -> list[str]:
        self._count += 1
        base = name or f"{op_type.lower()}_{self._count}"
        outputs = outputs or [f"{base}_out{i}" if n_out > 1 else f"{base}_out" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=base, domain=domain, **attrs))
        return outputs

    def one(self, op_type: str, inputs: list[str], **kw) -> str:
        return self.op(op_type, inputs, **kw)[0]

    def const(self, name: str, value: np.ndarray) -> str:
        """A named initializer (a model weight, or a graph input's default)."""
        self.initializers.append(self.sink.tensor(name, value))
        return name

    def constant(self, value: np.ndarray) -> str:
        """An initializer holding `value`, stored once per distinct dtype, shape and content."""
        value = np.require(value, requirements="C")
        key = (value.dtype.str, value.shape, value.tobytes())
        if key not in self._constants:
            self._constants[key] = self.const(f"const_{len(self._constants)}_{value.dtype.name}", value)
        return self._constants[key]

    def f32(self, value: float) -> str:
        """A float32 scalar."""
        return self.constant(np.array(value, dtype=np.float32))

    def i64(self, value: int | Sequence[int]) -> str:
        """An int64 scalar (from an int) or 1-D tensor (from a sequence): shapes, axes, split sizes."""
        return self.constant(np.array(value, dtype=np.int64))
