"""Decode steps replayed as captured CUDA graphs (docs/design.md#cuda-graphs).

A decode step of a kv_buffer graph launches a few hundred small kernels. At batch 1 on an H100, launching
them costs more than running them: GPT-2 small fp16 took ~2 ms a step (benchmarks/results/gpu-2026-11-22.md)
for ~0.1 ms of memory traffic, and GPT-2 XL, 25x the bytes, only 7.6 ms. ONNX Runtime can capture one run's
kernels as a CUDA graph and replay them with one launch, provided every later run binds the same device
addresses and shapes. So, per batch size B, a GraphDecoder keeps one set of device buffers for a whole
context and rewrites their contents in place:

- keys and values (B, nh, context, width) per layer, bound as past and present (GroupQueryAttention writes
  each step's position in place, as in KVBufferState);
- input_ids and position_ids (B, 1), attention_mask (B, context), all int64;
- logits (B, 1, V), copied to the host for rows that sample, or picked by the ArgMax session after a prefill run;
- picked (B, 1) int64: the decode graph's own greedy picks (below).

The mask is always `context` wide: such a graph reads its timeline from the mask's content (manifest
`wide_mask`, export/graph_attention.timeline_lengths), and the columns past the positions held are zeros.
Prefill runs (several positions, shapes that vary) go through the model's ordinary session into the same
buffers; decode steps go through a second session made with `enable_cuda_graph`, each batch size under its
own graph id (ONNX Runtime's `gpu_graph_id` run option), so the ordinary session never captures anything.
The second session holds its own copy of the weights on the GPU.

ONNX Runtime captures a graph only when no node copies between host and GPU. Two parts of an exported graph
would: the timeline's length (graph_attention.timeline_lengths, written without host shapes for this), and the
LM head's `logits_to_keep` slice, whose arithmetic on a graph input ONNX Runtime places on the GPU and whose
result the slice reads on the host. The decode session is therefore made from the graph with `logits_to_keep`
taken out of its inputs (decode_graph_bytes): its initializer, 0 (every position), is then a constant that
ONNX Runtime folds on the host, and a decode step has one position anyway.

The decode graph also picks each row's greedy token (an ArgMax over the logits appended to it, output PICKED, a
(B, 1) int64 device buffer captured with the rest), so a greedy step is one run and a (B,) copy to the host. Before,
the pick was a second session's run after each step: on a busy server each run's return waits for the GIL (another
thread's Python), so a step paid that wait twice. After a prefill run (the ordinary session, no ArgMax) the separate
ArgMax session still picks.

The buffers live as long as the loaded model (one set per batch size used) and serve one generation at a
time: a generation that starts while another of the same batch size runs gets the ordinary path. On the
CPU the same decoder runs both kinds of run through one session; tests use that to check it.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

import numpy as np

from .. import contract as C
from .graph_variant import reorder_rows
from .argmax_graph import argmax_fields
from ..modeldir.onnx_wire import with_graph_fields, without_graph_input

log = logging.getLogger(__name__)

GRAPH_ID_OPTION = "gpu_graph_id"  # ONNX Runtime's run option: which captured graph a run replays
POOL_GRAPH_IDS = 1 << 20  # a server pool's graph id is this + its capacity; a generation's is its batch size
PICKED = "gptedge_picked"  # the decode graph's own ArgMax output, (B, 1) int64 (see above)


def decode_graph_bytes(model: bytes) -> bytes:
    """The serialized graph for the decode session: logits_to_keep no longer an input, each row's greedy pick an
    output (see above)."""
    return with_graph_fields(without_graph_input(model, C.LOGITS_TO_KEEP), argmax_fields(C.LOGITS, PICKED))


class GraphDecoder:
    """The fixed buffers and bindings of one batch size; one generation at a time uses them (GraphDecodeState)."""

    def __init__(self, variant: Any, batch: int, decode_session: Any, run_options: Any = None,
                 on_failure: Any = None, rows_of: GraphDecoder | None = None):
        """rows_of: a wider decoder whose first `batch` rows of keys and values this one runs over (bound by
        device address), so a pool steps only the rows in use through a smaller captured graph."""
        shape, ort, device = variant.shape, variant.ort, variant.kv_device
        self.variant, self.batch, self.context = variant, batch, shape.context_length
        self._decode_session, self._run_options = decode_session, run_options
        self._on_failure = on_failure  # called with the error when a capture or replay fails

        def zeros(shape_, dtype):
            return ort.OrtValue.ortvalue_from_numpy(np.zeros(shape_, dtype), device, 0)

        # (batch, kv_heads, context, width) per layer's keys and values; rows_of's own when given
        self._kv_shape = [batch, shape.kv_heads, self.context, variant.kv_width]
        if rows_of is not None and (rows_of.batch < batch or rows_of.context != self.context):
            raise ValueError(f"a decoder of {batch} rows cannot run over one of {rows_of.batch}")
        # Zeroed once: a column past the timeline is masked, but 0 x NaN bits would still leak through attention.
        self.kv = rows_of.kv if rows_of is not None else [zeros(self._kv_shape, variant.kv_dtype)
                                                          for _ in range(2 * shape.n_layer)]
        self.ids, self.pos = zeros((batch, 1), np.int64), zeros((batch, 1), np.int64)  # (B, 1) each
        self.mask_host = np.zeros((batch, self.context), np.int64)  # (B, context): the host copy of self.mask
        self.mask = zeros((batch, self.context), np.int64)
        self.logits = ort.OrtValue.ortvalue_from_shape_and_type((batch, 1, shape.vocab_size), variant.logits_dtype,
                                                                device, 0)
        self.prefill_binding = self._bind(variant.session)
        self.variant.bind_keep(self.prefill_binding, 1)  # the LM head runs on the last position only
        self.token_ids = np.empty((batch, 1), np.int64)  # what crosses to the host per greedy step
        # (B, 1) int64 on the device: the decode run's own picks, when its graph has the ArgMax (decode_graph_bytes)
        fused = variant.pick_on_device and self._has_picks(decode_session)
        self.picked = zeros((batch, 1), np.int64) if fused else None
        self._picks_fresh = False  # the last run was a decode step that wrote self.picked
        self.decode_binding = self._bind_decode(decode_session)
        self._pick = None
        if variant.pick_on_device:
            self._pick = variant.argmax_session.io_binding()
            self._pick.bind_ortvalue_input("logits", self.logits)
            self._pick.bind_output("token_ids", "cpu", 0, np.int64, self.token_ids.shape, self.token_ids.ctypes.data)
        self.held = 0  # positions written so far by the generation using the buffers
        self._inputs: tuple[np.ndarray, ...] = ()

    def _bind(self, session: Any):
        binding = session.io_binding()
        device, dtype = self.variant.kv_device, self.variant.kv_dtype
        for past, present, buf in zip(self.variant.names.past_names, self.variant.names.present_names, self.kv,
                                      strict=True):
            if buf.shape()[0] == self.batch:
                binding.bind_ortvalue_input(past, buf)
                binding.bind_ortvalue_output(present, buf)
            else:  # the first `batch` rows of a wider buffer: row-major, so they start at its address
                binding.bind_input(past, device, 0, dtype, self._kv_shape, buf.data_ptr())
                binding.bind_output(present, device, 0, dtype, self._kv_shape, buf.data_ptr())
        binding.bind_ortvalue_output(C.LOGITS, self.logits)
        return binding

    @staticmethod
    def _has_picks(session: Any) -> bool:
        return any(o.name == PICKED for o in session.get_outputs())

    def _bind_decode(self, session: Any):
        """logits_to_keep unbound: the decode session has none, the ordinary one keeps every position of one."""
        binding = self._bind(session)
        for name, value in ((C.INPUT_IDS, self.ids), (C.ATTENTION_MASK, self.mask), (C.POSITION_IDS, self.pos)):
            binding.bind_ortvalue_input(name, value)
        if self.picked is not None and self._has_picks(session):
            binding.bind_ortvalue_output(PICKED, self.picked)
        return binding

    def _decode(self) -> None:
        try:
            self._decode_session.run_with_iobinding(self.decode_binding, self._run_options)
            self._picks_fresh = self.picked is not None and self._decode_session is not self.variant.session
        except Exception as e:  # ONNX Runtime refused to capture or replay: the same step on the ordinary session
            if self._decode_session is self.variant.session:
                raise
            log.warning("CUDA graph for batch %d failed, decoding without: %s", self.batch,
                        str(e).splitlines()[0][:300])
            if self._on_failure is not None:
                self._on_failure(e)
            self._decode_session, self._run_options = self.variant.session, None
            self.decode_binding = self._bind_decode(self.variant.session)
            self._picks_fresh = False  # the ordinary session has no ArgMax: pick() runs the ArgMax session
            self.variant.session.run_with_iobinding(self.decode_binding)

    def step(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> None:
        """One run into the buffers. input_ids (B, S), attention_mask (B, T), position_ids (B, S), T <= context."""
        B, S = input_ids.shape
        T = attention_mask.shape[1]
        if B != self.batch or T > self.context:
            raise ValueError(f"a decoder for batch {self.batch} and {self.context} positions was fed ({B}, {T})")
        if S == 1 and self.held:  # a decode step: the captured graph, over the context-wide mask
            self.ids.update_inplace(np.ascontiguousarray(input_ids, dtype=np.int64))
            self.pos.update_inplace(np.ascontiguousarray(position_ids, dtype=np.int64))
            if T == self.context:  # context-wide already (a server pool's every step): no copy into mask_host, which
                # no later step of this generation reads (none is longer; the next one's prefill clears it)
                self.mask.update_inplace(np.ascontiguousarray(attention_mask, dtype=np.int64))
            else:
                self.mask_host[:, :T] = attention_mask  # columns >= T stay zero (cleared at the prefill)
                self.mask.update_inplace(self.mask_host)
            self._decode()
        else:  # a prefill run (or chunk): the ordinary session, host inputs of this run's shapes
            self._picks_fresh = False
            if not self.held:
                self.mask_host[:] = 0
            self.mask_host[:, :T] = attention_mask
            # ONNX Runtime reads bound host inputs in place: keep them alive until the next run
            self._inputs = tuple(np.ascontiguousarray(a, dtype=np.int64)
                                 for a in (input_ids, attention_mask, position_ids))
            for name, array in zip((C.INPUT_IDS, C.ATTENTION_MASK, C.POSITION_IDS), self._inputs, strict=True):
                self.prefill_binding.bind_cpu_input(name, array)
            self.variant.session.run_with_iobinding(self.prefill_binding)
        self.held = T

    def last_logits(self) -> np.ndarray:
        return self.logits.numpy()[:, -1, :].astype(np.float32, copy=False)  # (B, V)

    def pick_logits(self) -> np.ndarray:
        """The greedy token of each row (B,) int64 from what the logits buffer holds now (whatever run wrote it),
        picked by the ArgMax session where the logits are."""
        self._picks_fresh = False  # the buffer no longer holds the last decode step's logits
        return self.pick()

    def pick(self) -> np.ndarray:
        """The greedy token of each row (B,) int64, picked where the logits are."""
        if self._pick is None:
            return self.last_logits().argmax(-1)
        if self._picks_fresh:  # the decode run picked them: one (B, 1) copy to the host
            return np.array(self.picked.numpy()[:, 0])  # a copy: on the CPU numpy() is a view the next run overwrites
        self.variant.argmax_session.run_with_iobinding(self._pick)
        return self.token_ids[:, 0]


class GraphDecodeState:
    """A DecodeState over a GraphDecoder, for one generation; dropping it frees the decoder for the next."""

    def __init__(self, decoder: GraphDecoder):
        self.decoder = decoder
        decoder.held = 0

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        self.decoder.step(input_ids, attention_mask, position_ids)
        return self.decoder.last_logits()

    def run_argmax(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        self.decoder.step(input_ids, attention_mask, position_ids)
        return self.decoder.pick()

    def reorder(self, rows: np.ndarray) -> None:
        if (rows == np.arange(len(rows))).all():
            return
        for buf in self.decoder.kv:  # each buffer makes a round trip through the host (numpy() copies on a GPU)
            host = buf.numpy()
            reorder_rows([host], rows, self.decoder.held)
            buf.update_inplace(host)


class CudaGraphs:
    """The capture session of one loaded model and its decoders, one per batch size."""

    def __init__(self, variant: Any, capture_session: Any):
        self.variant, self.session = variant, capture_session
        self._decoders: dict[int, GraphDecoder] = {}
        self._busy: set[int] = set()
        self._lock = threading.Lock()
        self.failed: str | None = None  # the first capture or replay error, when one happened

    def _failed(self, error: Exception) -> None:
        self.failed = self.failed or str(error).splitlines()[0][:300]

    def _run_options(self, batch: int):
        options = self.variant.ort.RunOptions()
        options.add_run_config_entry(GRAPH_ID_OPTION, str(batch))  # ids >= 1; -1 means "do not capture"
        return options

    def acquire(self, batch: int, max_length: int) -> GraphDecodeState | None:
        """A state over the batch size's decoder, or None when it is in use or the generation is too long."""
        if max_length > self.variant.shape.context_length:
            return None
        with self._lock:
            if batch in self._busy:
                return None
            self._busy.add(batch)
        try:
            decoder = self._decoders.get(batch)
            if decoder is None:
                decoder = self._decoders[batch] = GraphDecoder(self.variant, batch, self.session,
                                                               self._run_options(batch), self._failed)
                log.info("CUDA graph decoder for batch %d: %d positions", batch, decoder.context)
        except BaseException:
            self._release(batch)
            raise
        state = GraphDecodeState(decoder)
        weakref.finalize(state, self._release, batch)
        return state

    def pool_decoder(self, capacity: int, rows_of: GraphDecoder | None = None) -> GraphDecoder:
        """A decoder of its own for a server's DeviceSlotPool (never shared with generations), under a graph id
        apart from the per-batch ones; rows_of: the pool's widest decoder, whose first rows this one runs over."""
        return GraphDecoder(self.variant, capacity, self.session, self._run_options(POOL_GRAPH_IDS + capacity),
                            self._failed, rows_of)

    def _release(self, batch: int) -> None:
        with self._lock:
            self._busy.discard(batch)
