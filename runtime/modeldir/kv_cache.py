"""The KV cache's storage type on kv_buffer graphs (issue #23): fp32, fp16, int8 or int4, as data.

GroupQueryAttention (ONNX Runtime >= 1.23's contrib op) computes in the graph's float type and keeps its
cache, past and present one buffer (B, nh, max_len, width), in the type the graph declares for it:
- fp32: the graph's float type (the default; for an fp16 graph its cache is fp16 already);
- fp16: float16, no scales: converted on write, widened on read;
- int8: int8, symmetric, one calibrated scale per (layer, head, channel) for keys and for values
  (k_scale / v_scale initializers (1, nh, 1, hs), attribute kv_cache_bit_width 8);
- int4: uint8 holding two 4-bit values per byte, so width = hs / 2; scales as int8's, range +-7.

This module is the table every side reads (quantize's rewrite, the runtime's buffers, the load-time
claim check, the server's pool); plain Python, so the CLI's --help imports no numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgumentError

DEFAULT_KV_CACHE = "fp32"


@dataclass(frozen=True)
class KVCacheKind:
    name: str
    onnx_type: str  # the buffer's element type, as onnx_wire (and numpy) name it; fp32: the graph's float type
    itemsize: int  # bytes per element
    per_byte: int  # values held by one element: 2 for int4
    bits: int  # GroupQueryAttention's kv_cache_bit_width; 0: a float cache (no attribute, no scales)
    qmax: int  # largest magnitude a quantized value takes (symmetric); 0 for floats

    @property
    def quantized(self) -> bool:
        return self.bits > 0

    def width(self, head_dim: int) -> int:
        """The buffer's last dimension for a head of head_dim values."""
        return head_dim // self.per_byte

    def bytes_per_position(self, n_layer: int, n_head: int, head_dim: int) -> int:
        """Keys and values of one position over every layer, in this cache (the scales are per channel, not
        per position)."""
        return 2 * n_layer * n_head * self.width(head_dim) * self.itemsize


KV_CACHES = {
    "fp32": KVCacheKind("fp32", "float32", 4, 1, 0, 0),
    "fp16": KVCacheKind("fp16", "float16", 2, 1, 0, 0),
    "int8": KVCacheKind("int8", "int8", 1, 1, 8, 127),
    "int4": KVCacheKind("int4", "uint8", 1, 2, 4, 7),
}


def kv_cache_kind(name: str, error: type[Exception] = InvalidArgumentError) -> KVCacheKind:
    """The kind a --kv-cache value or a manifest names; one line naming the choices otherwise."""
    if name not in KV_CACHES:
        raise error(f"kv cache {name!r} is not one of {', '.join(KV_CACHES)}")
    return KV_CACHES[name]


def cache_onnx_type(name: str, float_type: str) -> str:
    """The element type a graph's past/present tensors have for this cache; fp32 means "as the graph computes"."""
    return float_type if name == DEFAULT_KV_CACHE else KV_CACHES[name].onnx_type
