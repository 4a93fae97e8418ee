"""A graph variant is one runtime object, chosen once at load from the manifest's `graph`
(docs/design.md#the-registries).

Each variant owns how its graph is fed: the KV cache of a generation (a DecodeState), how many
prompt positions one prefill run may take, a forward pass over every position (validation, eval,
the quantizer's checks) and the feeds the static quantizer's calibrator needs. Generation, eval,
the quantizer and the server call these and never ask which variant they have.

Adding a variant: subclass GraphVariant in its own module, give it a `name` (the manifest's `graph`
value), end the module with `VARIANT = TheClass`, and add its one line to runtime/registry.py
(GRAPH_VARIANTS), which the manifest check and `export --graph` read too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Protocol

import numpy as np

from .. import contract as C
from ..errors import ModelDirError
from ..modeldir.kv_cache import KV_CACHES
from ..modeldir.manifest import Manifest, ModelShape
from ..registry import GRAPH_VARIANTS

_ORT_FLOAT = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
_ORT_CACHE = {**_ORT_FLOAT, "tensor(int8)": np.int8, "tensor(uint8)": np.uint8}  # kv_cache.py's storage types


class DecodeState(Protocol):
    """The cache of one generation (or one server slot batch): fed step after step, never shared."""

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        """input_ids (B, S), attention_mask (B, P + S), position_ids (B, S) int64 -> last-position logits
        (B, V) float32. The returned array may be a view the next run overwrites."""

    def run_argmax(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        """As run, but -> the greedy token of each row (B,) int64, picked where the logits are (a GPU)."""

    def reorder(self, rows: np.ndarray) -> None:
        """Beam search: row r of the cache becomes what row rows[r] holds now. (B,) int"""


def reorder_rows(caches: Sequence[np.ndarray], rows: np.ndarray, length: int) -> None:
    """In place on host arrays (B, nh, >= length, hs): row r takes old row rows[r], positions [:length].
    Only rows that change are copied (beams mostly keep their row)."""
    changed = np.flatnonzero(rows != np.arange(len(rows)))
    if not len(changed):
        return
    for cache in caches:
        cache[changed, :, :length] = cache[rows[changed], :, :length]  # the right side is gathered first


class GraphVariant:
    """What every variant provides; built by `variant_for` around one InferenceSession."""

    name: ClassVar[str]

    def __init__(self, session: Any, ort: Any, manifest: Manifest, device: str):
        self.session, self.ort, self.manifest = session, ort, manifest
        self.huge_pages = True  # a generation's KV cache may sit on huge pages (load sets SessionConfig's choice)
        self.shape: ModelShape = manifest.shape
        self.names = C.IONames(manifest.shape.n_layer)
        self.output_names = list(manifest.outputs)
        inputs = {i.name: i.type for i in session.get_inputs()}
        outputs = {o.name: o.type for o in session.get_outputs()}
        # the cache's element type as the graph declares it (load's claim check has matched it to the manifest's
        # kv_cache), and its last dimension: head_dim, or head_dim / 2 for an int4 cache (two values a byte)
        self.kv_dtype = _ORT_CACHE.get(inputs.get(C.past_key(0)), np.float32)
        self.kv_width = KV_CACHES[manifest.kv_cache].width(manifest.shape.head_dim)
        self.logits_dtype = _ORT_FLOAT.get(outputs.get(C.LOGITS), np.float32)
        # where caches live: the first provider's device (CUDA keeps them on the GPU)
        self.kv_device = "cuda" if session.get_providers()[0] == "CUDAExecutionProvider" else "cpu"
        self.device = device

    # -- generation ---------------------------------------------------------------------------------
    def start(self, batch: int, max_length: int) -> DecodeState:
        """A fresh cache for `batch` rows that will hold at most `max_length` positions."""
        raise NotImplementedError

    def prefill_chunk(self, batch: int, requested: int | None) -> int | None:
        """Prompt positions per prefill run for a batch, given what the caller asked (None: one run)."""
        return requested

    def sequence_pool(self, capacity: int, max_length: int):
        """This variant's own pool for a continuous batch of up to `capacity` sequences, or None: then
        sequence_pool.pool_for gives the default (SequentialPool), which works for every variant."""
        return None

    # -- every position -----------------------------------------------------------------------------
    def empty_past(self, batch: int) -> list[np.ndarray]:
        """A zero-length past (B, nh, 0, width) per key and value, for forward()."""
        shape = (batch, self.shape.kv_heads, 0, self.kv_width)
        return [np.zeros(shape, self.kv_dtype) for _ in range(2 * self.shape.n_layer)]

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray,
                past: Sequence[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        """One run -> (logits (B, S, V) float32 for every position, presents (B, nh, P + S, hs) as numpy)."""
        raise NotImplementedError

    # -- calibration (static quantization) ----------------------------------------------------------
    @classmethod
    def calibration_feeds(cls, input_ids: np.ndarray, shape: ModelShape) -> dict[str, np.ndarray]:
        """Feeds for a prefill of input_ids (1, L) over an empty cache, as plain numpy (ORT's calibrator)."""
        raise NotImplementedError


def variant_class(graph: str) -> type[GraphVariant]:
    """The class for a manifest's `graph` value; one line when it is unknown."""
    GRAPH_VARIANTS.check(graph, ModelDirError, where="manifest graph")
    return GRAPH_VARIANTS.load(graph)


def variant_for(session: Any, ort: Any, manifest: Manifest, device: str) -> GraphVariant:
    return variant_class(manifest.graph)(session, ort, manifest, device)
