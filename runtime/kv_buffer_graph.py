"""The kv_buffer graph: past and present are one preallocated buffer per layer, updated in place.

Each layer's key and value buffer (B, nh, max_len, hs) is allocated once per generation by ONNX
Runtime on the provider's device and bound as both past and present, so GroupQueryAttention
writes each step's positions in place. Logits (B, 1, V) land in one preallocated host array.
Per step only input_ids, attention_mask and position_ids are bound again.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import contract as C
from .graph_variant import GraphVariant, reorder_rows
from .manifest import ModelShape


class KVBufferState:
    """One IO binding that lives for a whole generation."""

    def __init__(self, graph: "KVBufferGraph", batch: int, max_length: int):
        shape = graph.shape
        kv_shape = (batch, shape.n_head, max_length, shape.head_dim)
        # Left uninitialised: GroupQueryAttention reads positions < total_sequence_length only, and every
        # such position (padding included) was written by an earlier step of this generation.
        self.buffers = [graph.ort.OrtValue.ortvalue_from_shape_and_type(kv_shape, graph.kv_dtype, graph.kv_device, 0)
                        for _ in range(2 * shape.n_layer)]
        self._session = graph.session
        self._binding = binding = graph.session.io_binding()
        for past, present, buf in zip(graph.names.past_names, graph.names.present_names, self.buffers):
            binding.bind_ortvalue_input(past, buf)
            binding.bind_ortvalue_output(present, buf)
        graph.bind_keep(binding, 1)  # the LM head runs on the last position only
        self.logits = np.empty((batch, 1, shape.vocab_size), dtype=graph.logits_dtype)  # overwritten each step
        binding.bind_output(C.LOGITS, "cpu", 0, self.logits.dtype, self.logits.shape, self.logits.ctypes.data)
        self._inputs: tuple[np.ndarray, ...] = ()
        self._held = 0
        self._device = graph.kv_device

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        # ONNX Runtime reads bound host inputs in place: keep them alive until the next step rebinds.
        self._inputs = tuple(np.ascontiguousarray(a, dtype=np.int64) for a in (input_ids, attention_mask, position_ids))
        for name, array in zip((C.INPUT_IDS, C.ATTENTION_MASK, C.POSITION_IDS), self._inputs):
            self._binding.bind_cpu_input(name, array)
        self._session.run_with_iobinding(self._binding)
        self._held = attention_mask.shape[1]  # positions written so far
        return self.logits[:, -1, :].astype(np.float32, copy=False)  # (B, V), a view of self.logits

    def reorder(self, rows: np.ndarray) -> None:
        if self._device != "cpu":
            raise NotImplementedError("beam search over a kv_buffer cache on a GPU is not supported yet")
        reorder_rows([b.numpy() for b in self.buffers], rows, self._held)  # numpy() is a view on the host


class KVBufferGraph(GraphVariant):
    name = C.GRAPH_KV_BUFFER

    def __init__(self, session, ort, manifest, device):
        super().__init__(session, ort, manifest, device)
        # logits_to_keep is an overridable initializer (default 0: every position), so GenAI may leave it
        # unfed; dirs exported before gptedge 0.1's GenAI support have it as a required input.
        self._keep_required = C.LOGITS_TO_KEEP in {i.name for i in session.get_inputs()}
        self._keep = {k: ort.OrtValue.ortvalue_from_numpy(np.array(k, np.int64)) for k in (0, 1)}  # read-only

    def bind_keep(self, binding, keep: int) -> None:
        """Bind logits_to_keep (0: every position, 1: the last). ONNX Runtime's bind_cpu_input finds
        required inputs only, so an overridable initializer is bound as a value."""
        if keep or self._keep_required:
            binding.bind_ortvalue_input(C.LOGITS_TO_KEEP, self._keep[keep])

    def start(self, batch: int, max_length: int) -> KVBufferState:
        return KVBufferState(self, batch, max_length)

    def prefill_chunk(self, batch: int, requested: int | None) -> int | None:
        # ONNX Runtime's CPU GroupQueryAttention refuses a multi-position run over a non-empty past for
        # batch > 1 ("batch_size must be 1 when sequence_length > 1 and past context is given").
        return requested if batch == 1 else None

    def sequence_pool(self, capacity: int, max_length: int):
        if self.kv_device != "cpu":  # SlotPool's rows are host memory: elsewhere each sequence keeps its own
            return super().sequence_pool(capacity, max_length)
        from .kv_buffer_pool import SlotPool

        return SlotPool(self, capacity, max_length)

    def forward(self, input_ids, attention_mask, position_ids, past: Sequence[np.ndarray]):
        """Off the generation path (validation, eval): grow the given past into buffers that hold the
        total, run in place, return copies cut to the total."""
        total = attention_mask.shape[1]
        binding = self.session.io_binding()
        names = (C.INPUT_IDS, C.ATTENTION_MASK, C.POSITION_IDS)
        inputs = [np.ascontiguousarray(a, dtype=np.int64) for a in (input_ids, attention_mask, position_ids)]
        for name, array in zip(names, inputs):  # read in place by the run: `inputs` keeps them alive
            binding.bind_cpu_input(name, array)
        self.bind_keep(binding, 0)  # every position
        binding.bind_output(C.LOGITS, "cpu")
        owned = []
        for in_name, out_name, p in zip(self.names.past_names, self.names.present_names, past):
            p = np.asarray(p.numpy() if hasattr(p, "numpy") else p)
            grown = np.zeros(p.shape[:2] + (total,) + p.shape[3:], p.dtype)  # (B, nh, T, hs)
            grown[:, :, :p.shape[2]] = p
            # ONNX Runtime's own buffer (one over numpy memory would die with the array), bound as both
            value = self.ort.OrtValue.ortvalue_from_shape_and_type(grown.shape, grown.dtype, self.kv_device, 0)
            value.update_inplace(grown)
            binding.bind_ortvalue_input(in_name, value)
            binding.bind_ortvalue_output(out_name, value)
            owned.append(value)
        self.session.run_with_iobinding(binding)
        logits = binding.get_outputs()[0].numpy().astype(np.float32, copy=False)
        return logits, [b.numpy()[:, :, :total] for b in owned]

    @classmethod
    def calibration_feeds(cls, input_ids: np.ndarray, shape: ModelShape) -> dict[str, np.ndarray]:
        """Zeroed buffers with room for the window plus one, and logits_to_keep 0 (every position)."""
        feeds = {C.INPUT_IDS: input_ids, C.ATTENTION_MASK: np.ones_like(input_ids),
                 C.POSITION_IDS: np.arange(input_ids.shape[1], dtype=np.int64)[None],
                 C.LOGITS_TO_KEEP: np.array(0, dtype=np.int64)}
        kv_shape = (1, shape.n_head, input_ids.shape[1] + 1, shape.head_dim)
        feeds.update({name: np.zeros(kv_shape, np.float32) for name in C.IONames(shape.n_layer).past_names})
        return feeds
