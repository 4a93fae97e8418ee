"""kv_buffer graphs: one IO binding that lives for a whole generation.

Each layer's key and value buffer (B, nh, max_len, hs) is allocated once by ONNX Runtime on the
provider's device and bound as both past and present, so GroupQueryAttention writes each step's
positions in place. Logits (B, 1, V) land in one preallocated host array. Per step only
input_ids, attention_mask and position_ids are bound again; nothing else is allocated or copied.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import contract as C


@dataclass(frozen=True)
class FreshBuffers:
    """The past of a generation's first step on a kv_buffer graph: buffers of max_length, not yet made."""

    batch: int
    max_length: int


class KVBufferBinding:
    def __init__(self, session, ort, n_layer: int, kv_shape: tuple[int, int, int, int], kv_dtype,
                 logits_shape: tuple[int, int, int], logits_dtype, device: str):
        names = C.IONames(n_layer)
        # Left uninitialised: GroupQueryAttention reads positions < total_sequence_length only, and every
        # such position (padding included) was written by an earlier step of this generation.
        self.buffers = [ort.OrtValue.ortvalue_from_shape_and_type(kv_shape, kv_dtype, device, 0)
                        for _ in range(2 * n_layer)]
        self._session = session
        self._binding = binding = session.io_binding()
        for past, present, buf in zip(names.past_names, names.present_names, self.buffers):
            binding.bind_ortvalue_input(past, buf)
            binding.bind_ortvalue_output(present, buf)
        self._keep = np.ones((), dtype=np.int64)  # logits_to_keep = 1: the LM head runs on the last position
        binding.bind_cpu_input(C.LOGITS_TO_KEEP, self._keep)
        self.logits = np.empty(logits_shape, dtype=logits_dtype)  # (B, 1, V), overwritten by every step
        binding.bind_output(C.LOGITS, "cpu", 0, self.logits.dtype, self.logits.shape, self.logits.ctypes.data)
        self._inputs: tuple[np.ndarray, ...] = ()

    def step(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        """One run -> last-position logits (B, V) float32: a view the next step overwrites."""
        # ONNX Runtime reads bound host inputs in place: keep them alive until the next step rebinds.
        self._inputs = tuple(np.ascontiguousarray(a, dtype=np.int64) for a in (input_ids, attention_mask, position_ids))
        for name, array in zip((C.INPUT_IDS, C.ATTENTION_MASK, C.POSITION_IDS), self._inputs):
            self._binding.bind_cpu_input(name, array)
        self._session.run_with_iobinding(self._binding)
        return self.logits[:, -1, :].astype(np.float32, copy=False)
