"""Graph surgery the quantization methods share: walk the fp32 graph, emit a new one.

The math lives in int8_math.py, the per-method rewiring in dynamic.py / weight_only.py /
static.py; this file finds nodes by what they are (a MatMul with a 2-D weight initializer; an
initializer shared by a Gather and a Gemm with transB, i.e. the tied embedding / LM head), not
by name, and assembles the result.

A big fp32 source is never held whole: its initializers are read one at a time from the
external-data file (`Initializers`, memory-mapped on access and dropped after), the new weights
are kept as numpy arrays (a quarter of the fp32 bytes for 8 bits) and become protobuf only in
`finish`, one at a time; the quantizer's save_onnx then moves them to the output's data file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from gptedge.onnx_files import Initializers
from gptedge.runtime.contract import INPUT_IDS, past_key
from gptedge.runtime.errors import QuantizationError

MS_DOMAIN = "com.microsoft"


@dataclass
class Rewrite:
    """Collects the new graph while walking the old one."""

    model: onnx.ModelProto
    base_dir: Path | None = None  # where the model's external data lies (its model dir), if it has any
    weights: Initializers = field(init=False)  # name -> array, read on access
    new_nodes: list[onnx.NodeProto] = field(default_factory=list)
    new_inits: dict[str, np.ndarray] = field(default_factory=dict)
    quantized: dict[str, str] = field(default_factory=dict)  # node name -> what it became

    def __post_init__(self) -> None:
        self.weights = Initializers(self.model, self.base_dir)

    def init(self, name: str, value: np.ndarray) -> str:
        self.new_inits[name] = np.require(value, requirements="C")
        return name

    def node(self, op: str, inputs: list[str], outputs: list[str], name: str, domain: str = "", **attrs) -> None:
        self.new_nodes.append(helper.make_node(op, inputs, outputs, name=name, domain=domain, **attrs))

    def is_linear(self, node: onnx.NodeProto) -> bool:
        return (node.op_type == "MatMul" and node.input[1] in self.weights
                and len(self.weights.shape(node.input[1])) == 2)

    def head_linear(self) -> str | None:
        """A task head's graph (export/head_graph.py): the name of the linear MatMul that reads the extract
        state (the GatherND that picks each row's last attended position), i.e. the head's `score` /
        `multiple_choice_head`; None in a language model's graph, which has no GatherND."""
        extract = {n.output[0] for n in self.model.graph.node if n.op_type == "GatherND"}
        return next((n.name for n in self.model.graph.node if self.is_linear(n) and n.input[0] in extract), None)

    def bias_adds(self) -> dict[str, tuple[onnx.NodeProto, str]]:
        """Linear MatMul output -> (the Add that is its only consumer, the 1-D (N,) initializer it adds)."""
        users: dict[str, list[onnx.NodeProto]] = {}
        for n in self.model.graph.node:
            for i in n.input:
                users.setdefault(i, []).append(n)
        graph_outputs = {o.name for o in self.model.graph.output}
        found = {}
        for node in self.model.graph.node:
            out = node.output[0]
            if not self.is_linear(node) or out in graph_outputs or len(users.get(out, [])) != 1:
                continue
            add = users[out][0]
            if add.op_type != "Add":
                continue
            bias = add.input[1] if add.input[0] == out else add.input[0]
            width = self.weights.shape(node.input[1])[1]
            if bias in self.weights and self.weights.shape(bias) == (width,):
                found[out] = (add, bias)
        return found

    def untied_head(self) -> tuple[onnx.NodeProto, onnx.NodeProto] | None:
        """-> (the token embedding's Gather, the LM head's Gemm) where the head has a (V, C) weight of its own
        (an untied head); None where the head is tied or there is none."""
        ids = {INPUT_IDS} | {n.output[0] for n in self.model.graph.node if n.op_type == "Reshape"
                             and n.input[0] == INPUT_IDS}
        gather = next((n for n in self.model.graph.node if n.op_type == "Gather" and n.input[1] in ids
                       and n.input[0] in self.weights), None)
        if gather is None:
            return None
        for gemm in self.model.graph.node:
            if (gemm.op_type == "Gemm" and gemm.input[1] in self.weights and gemm.input[1] != gather.input[0]
                    and next((a.i for a in gemm.attribute if a.name == "transB"), 0) == 1
                    and self.weights.shape(gemm.input[1]) == self.weights.shape(gather.input[0])):
                return gather, gemm
        return None

    def tied_embedding(self) -> tuple[str, onnx.NodeProto, onnx.NodeProto | None]:
        """-> (weight name, its Gather, its LM-head Gemm); a task head's graph has no LM head: its Gemm is None
        and the Gather is the token embedding's (the one reading input_ids, directly or reshaped)."""
        for gemm in self.model.graph.node:
            if gemm.op_type == "Gemm" and gemm.input[1] in self.weights:
                trans_b = next((a.i for a in gemm.attribute if a.name == "transB"), 0)
                gather = next((n for n in self.model.graph.node if n.op_type == "Gather"
                               and n.input[0] == gemm.input[1]), None)
                if trans_b == 1 and gather is not None:
                    return gemm.input[1], gather, gemm
        ids = {INPUT_IDS} | {n.output[0] for n in self.model.graph.node if n.op_type == "Reshape"
                             and n.input[0] == INPUT_IDS}
        gather = next((n for n in self.model.graph.node if n.op_type == "Gather" and n.input[1] in ids
                       and n.input[0] in self.weights), None)
        if gather is not None and not any(i.name == past_key(0) for i in self.model.graph.input):  # no KV cache
            return gather.input[0], gather, None
        if self.untied_head() is not None:
            raise QuantizationError("this method takes a tied embedding / LM head only; the graph's LM head has a "
                                    "weight of its own (untied): use --method weight-only")
        raise ValueError("graph has no tied embedding / LM head (Gather + Gemm transB on one weight)")

    def finish(self, producer_note: str) -> onnx.ModelProto:
        """The new graph, every initializer inline (the old ones it still uses read back from external data)."""
        g = self.model.graph
        used = {i for n in self.new_nodes for i in n.input}
        opsets = [o for o in self.model.opset_import if o.domain not in ("", MS_DOMAIN)]
        opsets += [helper.make_opsetid("",
                                       next(o.version for o in self.model.opset_import if o.domain in ("", "ai.onnx"))),
                   helper.make_opsetid(MS_DOMAIN, 1)]
        # make_model copies the graph it is given: give it none of the weights, then add them in place
        out = helper.make_model(helper.make_graph(self.new_nodes, g.name, list(g.input), list(g.output)),
                                opset_imports=opsets, producer_name="gptedge", doc_string=producer_note)
        for t in g.initializer:
            if t.name in used and t.name not in self.new_inits:
                out.graph.initializer.append(self.weights.inline_copy(t.name))
        for name in list(self.new_inits):
            value = self.new_inits.pop(name)  # each array is released as its proto is made
            if name in used:
                out.graph.initializer.append(numpy_helper.from_array(value, name))
        out.ir_version = self.model.ir_version
        return out
