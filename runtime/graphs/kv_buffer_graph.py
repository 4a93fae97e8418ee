"""The kv_buffer graph: past and present are one preallocated buffer per layer, updated in place.

Each layer's key and value buffer (B, nh, max_len, hs) is allocated once per generation (on the CPU all of them
views of one numpy block, on huge pages where SessionConfig.huge_pages; on a GPU by ONNX Runtime on the device) and
bound as both past and present, so GroupQueryAttention writes each step's positions in place. Per step only
input_ids, attention_mask and position_ids are bound again.

Logits (B, 1, V) land in one preallocated array: on the CPU a host array; on the GPU a device
buffer, from which greedy decoding (run_argmax) picks the tokens there, with a one-node ArgMax
session bound to it, so only the (B,) ids cross to the host.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence

import numpy as np

from .. import contract as C
from .argmax_graph import argmax_model
from .cuda_graph import CudaGraphs, GraphDecoder
from .device_slot_pool import DeviceSlotPool
from .graph_variant import GraphVariant, reorder_rows
from .huge_pages import numpy_small_pages
from .kv_buffer_pool import SlotPool
from ..modeldir.manifest import ModelShape
from .session import CPU_PROVIDER, CUDA_PROVIDER

log = logging.getLogger(__name__)


CACHE_LINE = 64


def aligned_empty(shape: tuple[int, ...], dtype) -> np.ndarray:
    """np.empty starting on a cache line, as ONNX Runtime's own allocator would (numpy's large arrays start 16 bytes
    into a page)."""
    dtype = np.dtype(dtype)
    raw = np.empty(int(np.prod(shape)) * dtype.itemsize + CACHE_LINE, np.uint8)
    offset = -raw.ctypes.data % CACHE_LINE
    return raw[offset:offset + int(np.prod(shape)) * dtype.itemsize].view(dtype).reshape(shape)


class KVBufferState:
    """One IO binding that lives for a whole generation."""

    def __init__(self, graph: "KVBufferGraph", batch: int, max_length: int):
        shape = graph.shape
        kv_shape = (batch, shape.kv_heads, max_length, graph.kv_width)  # kv_width: head_dim, or head_dim / 2 (int4)
        # Left uninitialised: GroupQueryAttention reads positions < total_sequence_length only, and every
        # such position (padding included) was written by an earlier step of this generation.
        if graph.kv_device == "cpu":
            # One block (2 x n_layer, *kv_shape), so numpy advises huge pages for it (over 4 MB): every step reads
            # each layer's window (runtime/graphs/huge_pages.py); each buffer is a view ONNX Runtime writes in place.
            with contextlib.nullcontext() if graph.huge_pages else numpy_small_pages():
                self._block = aligned_empty((2 * shape.n_layer, *kv_shape), graph.kv_dtype)
            self.buffers = [graph.ort.OrtValue.ortvalue_from_numpy(b) for b in self._block]
        else:
            self.buffers = [graph.ort.OrtValue.ortvalue_from_shape_and_type(kv_shape, graph.kv_dtype,
                                                                            graph.kv_device, 0)
                            for _ in range(2 * shape.n_layer)]
        self._session = graph.session
        self._binding = binding = graph.session.io_binding()
        for past, present, buf in zip(graph.names.past_names, graph.names.present_names, self.buffers, strict=True):
            binding.bind_ortvalue_input(past, buf)
            binding.bind_ortvalue_output(present, buf)
        graph.bind_keep(binding, 1)  # the LM head runs on the last position only
        logits_shape = (batch, 1, shape.vocab_size)
        self._device = graph.kv_device
        self._pick = None  # the ArgMax session's binding, on a GPU
        if not graph.pick_on_device:
            self.logits = np.empty(logits_shape, dtype=graph.logits_dtype)  # overwritten each step
            binding.bind_output(C.LOGITS, "cpu", 0, self.logits.dtype, logits_shape, self.logits.ctypes.data)
        else:
            self.device_logits = graph.ort.OrtValue.ortvalue_from_shape_and_type(logits_shape, graph.logits_dtype,
                                                                                 self._device, 0)
            binding.bind_ortvalue_output(C.LOGITS, self.device_logits)
            self.token_ids = np.empty((batch, 1), np.int64)  # what crosses to the host per step
            self._pick = graph.argmax_session.io_binding()
            self._pick.bind_ortvalue_input("logits", self.device_logits)
            self._pick.bind_output("token_ids", "cpu", 0, np.int64, self.token_ids.shape, self.token_ids.ctypes.data)
        self._inputs: tuple[np.ndarray, ...] = ()
        self._held = 0
        self._graph = graph

    def _step(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> None:
        # ONNX Runtime reads bound host inputs in place: keep them alive until the next step rebinds.
        self._inputs = tuple(np.ascontiguousarray(a, dtype=np.int64) for a in (input_ids, attention_mask, position_ids))
        for name, array in zip((C.INPUT_IDS, C.ATTENTION_MASK, C.POSITION_IDS), self._inputs, strict=True):
            self._binding.bind_cpu_input(name, array)
        self._session.run_with_iobinding(self._binding)
        self._held = attention_mask.shape[1]  # positions written so far

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        self._step(input_ids, attention_mask, position_ids)
        if self._pick is not None:  # the whole (B, 1, V) comes over: sampling reads every logit
            return self.device_logits.numpy()[:, -1, :].astype(np.float32, copy=False)
        return self.logits[:, -1, :].astype(np.float32, copy=False)  # (B, V), a view of self.logits

    def run_argmax(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        """Greedy tokens (B,) int64; on a GPU picked there (ArgMax takes the first of equal logits, as numpy)."""
        if self._pick is None:
            return self.run(input_ids, attention_mask, position_ids).argmax(-1)
        self._step(input_ids, attention_mask, position_ids)
        self._graph.argmax_session.run_with_iobinding(self._pick)
        return self.token_ids[:, 0]

    def reorder(self, rows: np.ndarray) -> None:
        if self._device == "cpu":
            reorder_rows([b.numpy() for b in self.buffers], rows, self._held)  # numpy() is a view on the host
            return
        if (rows == np.arange(len(rows))).all():
            return
        for buf in self.buffers:  # on a GPU each buffer makes a round trip through the host (numpy() copies)
            host = buf.numpy()
            reorder_rows([host], rows, self._held)
            buf.update_inplace(host)


class KVBufferGraph(GraphVariant):
    name = C.GRAPH_KV_BUFFER

    def __init__(self, session, ort, manifest, device):
        super().__init__(session, ort, manifest, device)
        # logits_to_keep is an overridable initializer (default 0: every position), so GenAI may leave it
        # unfed; dirs exported before gptedge 0.1's GenAI support have it as a required input.
        self._keep_required = C.LOGITS_TO_KEEP in {i.name for i in session.get_inputs()}
        self._keep = {k: ort.OrtValue.ortvalue_from_numpy(np.array(k, np.int64)) for k in (0, 1)}  # read-only
        self._argmax_session = None
        if self.kv_device == "cuda" and self.kv_dtype == np.float32:
            # ONNX Runtime's CUDA GroupQueryAttention takes fp16 / bf16 only: an fp32 graph's attention runs on the
            # CPU, so its in-place cache must be host memory (a device cache copied to the CPU node and back loses
            # the in-place writes: greedy left the CPU's path after 1-2 tokens on an H200).
            self.kv_device = "cpu"
            log.warning("an fp32 kv_buffer graph on CUDA: attention and its cache stay on the CPU (ONNX Runtime's "
                        "GroupQueryAttention has no fp32 CUDA kernel); `gptedge quantize --method fp16` for the GPU")
        # Greedy tokens are picked where the logits are on a GPU; on the CPU numpy's argmax is as fast
        # (tests set it on the CPU to check the ArgMax session there)
        self.pick_on_device = self.kv_device != "cpu"
        self.cuda_graphs: CudaGraphs | None = None  # decode steps replayed as CUDA graphs (enable_cuda_graphs)

    def enable_cuda_graphs(self, capture_session) -> None:
        """Replay decode steps as CUDA graphs through `capture_session` (made with enable_cuda_graph) where the
        dir's graph takes a context-wide mask (manifest wide_mask); runtime/graphs/cuda_graph.py says how."""
        self.cuda_graphs = CudaGraphs(self, capture_session)

    @property
    def argmax_session(self):
        """The one-node ArgMax session on the graph's device, made at first use and shared by generations."""
        if self._argmax_session is None:
            model = argmax_model(self.logits_dtype == np.float16)
            providers = [CUDA_PROVIDER, CPU_PROVIDER] if self.kv_device == "cuda" else [CPU_PROVIDER]
            options = self.ort.SessionOptions()  # one node: no thread pool of its own spinning beside the model's
            options.intra_op_num_threads = 1
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            self._argmax_session = self.ort.InferenceSession(model, options, providers=providers)
        return self._argmax_session

    def bind_keep(self, binding, keep: int) -> None:
        """Bind logits_to_keep (0: every position, 1: the last). ONNX Runtime's bind_cpu_input finds
        required inputs only, so an overridable initializer is bound as a value."""
        if keep or self._keep_required:
            binding.bind_ortvalue_input(C.LOGITS_TO_KEEP, self._keep[keep])

    def start(self, batch: int, max_length: int):
        if self.cuda_graphs is not None:
            state = self.cuda_graphs.acquire(batch, max_length)
            if state is not None:
                return state
        return KVBufferState(self, batch, max_length)

    def prefill_chunk(self, batch: int, requested: int | None) -> int | None:
        # ONNX Runtime's CPU GroupQueryAttention refuses a multi-position run over a non-empty past for
        # batch > 1 ("batch_size must be 1 when sequence_length > 1 and past context is given").
        return requested if batch == 1 else None

    @property
    def shares_device_prefills(self) -> bool:
        """Its server pool is the GPU's DeviceSlotPool: newcomers share launch-bound prefill runs on the device."""
        return self.kv_device != "cpu" and bool(self.manifest.wide_mask)

    def sequence_pool(self, capacity: int, max_length: int):
        if self.kv_device == "cpu":
            return SlotPool(self, capacity, max_length)
        if self.shares_device_prefills:  # rows of their own on the device, one (captured) decode run for all of them
            return DeviceSlotPool(self, capacity, max_length, self.pool_decoder(capacity), self.pool_decoder)
        return super().sequence_pool(capacity, max_length)  # SlotPool's rows are host memory

    def pool_decoder(self, capacity: int, rows_of: GraphDecoder | None = None) -> GraphDecoder:
        """A decoder of `capacity` rows for a DeviceSlotPool (over the first rows of `rows_of`'s cache when given):
        through the capture session where CUDA graphs are on."""
        if self.cuda_graphs is not None:
            return self.cuda_graphs.pool_decoder(capacity, rows_of)
        return GraphDecoder(self, capacity, self.session, rows_of=rows_of)

    def forward(self, input_ids, attention_mask, position_ids, past: Sequence[np.ndarray]):
        """Off the generation path (validation, eval): grow the given past into buffers that hold the
        total, run in place, return copies cut to the total."""
        total = attention_mask.shape[1]
        binding = self.session.io_binding()
        names = (C.INPUT_IDS, C.ATTENTION_MASK, C.POSITION_IDS)
        inputs = [np.ascontiguousarray(a, dtype=np.int64) for a in (input_ids, attention_mask, position_ids)]
        for name, array in zip(names, inputs, strict=True):  # read in place by the run: `inputs` keeps them alive
            binding.bind_cpu_input(name, array)
        self.bind_keep(binding, 0)  # every position
        binding.bind_output(C.LOGITS, "cpu")
        owned = []
        for in_name, out_name, p in zip(self.names.past_names, self.names.present_names, past, strict=True):
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
        kv_shape = (1, shape.kv_heads, input_ids.shape[1] + 1, shape.head_dim)
        feeds.update({name: np.zeros(kv_shape, np.float32) for name in C.IONames(shape.n_layer).past_names})
        return feeds


VARIANT = KVBufferGraph
