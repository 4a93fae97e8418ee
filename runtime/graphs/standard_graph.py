"""The standard graph (Optimum's contract): past and present are separate tensors.

Each step's presents come back as ONNX Runtime values and are fed, uncopied, as the next step's
past. Graphs with the optional `logits_to_keep` run the LM head on the last position only.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .. import contract as C
from ..modeldir.manifest import ModelShape
from .graph_variant import GraphVariant, reorder_rows


class StandardState:
    def __init__(self, graph: "StandardGraph", batch: int):
        self._graph = graph
        self._past: list = graph.empty_past(batch)  # numpy at first, then ORT values

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        g = self._graph
        value = g.ort.OrtValue.ortvalue_from_numpy
        feeds = {C.INPUT_IDS: value(input_ids), C.ATTENTION_MASK: value(attention_mask),
                 C.POSITION_IDS: value(position_ids)}
        if g.keep_last is not None:
            feeds[C.LOGITS_TO_KEEP] = g.keep_last
        for name, kv in zip(g.names.past_names, self._past, strict=True):
            feeds[name] = value(kv) if isinstance(kv, np.ndarray) else kv
        logits, *self._past = g.session.run_with_ort_values(g.output_names, feeds)
        return logits.numpy()[:, -1, :].astype(np.float32, copy=False)  # (B, V)

    def run_argmax(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        return self.run(input_ids, attention_mask, position_ids).argmax(-1)  # (B,) int64

    def reorder(self, rows: np.ndarray) -> None:
        host = [p if isinstance(p, np.ndarray) else p.numpy() for p in self._past]  # views of host values
        if self._graph.kv_device == "cpu":
            reorder_rows(host, rows, host[0].shape[2])
        else:  # a device cache goes through the host once (numpy() copies it)
            value = self._graph.ort.OrtValue.ortvalue_from_numpy
            self._past = [value(np.ascontiguousarray(h[rows]), self._graph.kv_device, 0) for h in host]


class StandardGraph(GraphVariant):
    name = C.GRAPH_STANDARD

    def __init__(self, session, ort, manifest, device):
        super().__init__(session, ort, manifest, device)
        overridable = {i.name for i in session.get_overridable_initializers()}
        keep = np.array(1, dtype=np.int64)  # read-only, shared by every generation
        self.keep_last = ort.OrtValue.ortvalue_from_numpy(keep) if C.LOGITS_TO_KEEP in overridable else None

    def start(self, batch: int, max_length: int) -> StandardState:
        return StandardState(self, batch)  # the cache grows with each step: max_length is not needed

    def forward(self, input_ids, attention_mask, position_ids, past: Sequence[np.ndarray]):
        feeds = {C.INPUT_IDS: input_ids, C.ATTENTION_MASK: attention_mask, C.POSITION_IDS: position_ids}
        feeds.update(zip(self.names.past_names, past, strict=True))
        logits, *presents = self.session.run(self.output_names, feeds)
        return logits.astype(np.float32, copy=False), presents

    @classmethod
    def calibration_feeds(cls, input_ids: np.ndarray, shape: ModelShape) -> dict[str, np.ndarray]:
        feeds = {C.INPUT_IDS: input_ids, C.ATTENTION_MASK: np.ones_like(input_ids),
                 C.POSITION_IDS: np.arange(input_ids.shape[1], dtype=np.int64)[None]}
        kv_shape = (1, shape.kv_heads, 0, shape.head_dim)
        feeds.update({name: np.zeros(kv_shape, np.float32) for name in C.IONames(shape.n_layer).past_names})
        return feeds


VARIANT = StandardGraph
