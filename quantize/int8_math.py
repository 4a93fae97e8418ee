"""Quantization math, apart from the graph surgery that applies it. Pure numpy, symmetric int8."""

from __future__ import annotations

import numpy as np

from .scale_search import SYM_SHRINK_8BIT, search_symmetric

QMAX = 127  # symmetric: -127..127, so -x quantizes exactly like x


# Reduced range: weights in -63..63 (7 bits). x86 CPUs without VNNI multiply u8 activations by s8
# weights with vpmaddubsw, whose pairwise int16 sums saturate past 32767: 2 x 255 x 63 = 32130 never
# does, 2 x 255 x 127 often does (sample model, AVX2: KL 0.00151 with 8-bit weights, 0.00053 with 7).
QMAX_REDUCED = 63


def _scale(absmax: np.ndarray, qmax: int = QMAX) -> np.ndarray:
    return np.where(absmax > 0, absmax / qmax, 1.0).astype(np.float32)


def quantize_columns(w: np.ndarray, per_channel: bool = True, qmax: int = QMAX) -> tuple[np.ndarray, np.ndarray]:
    """W (K, N) float -> (int8 (K, N) in -qmax..qmax, scale (N,)): one scale per output column, or one for all."""
    absmax = np.abs(w).max(axis=0) if per_channel else np.full(w.shape[1], np.abs(w).max())
    scale = _scale(absmax, qmax)
    q = np.clip(np.rint(w / scale), -qmax, qmax).astype(np.int8)
    return q, scale


def quantize_rows(w: np.ndarray, per_channel: bool = True, qmax: int = QMAX) -> tuple[np.ndarray, np.ndarray]:
    """E (V, C) float -> (int8 (V, C), scale (V,)): one scale per row (vocabulary entry)."""
    q, scale = quantize_columns(w.T, per_channel, qmax)
    return q.T, scale


def quantize_blocks_u8(w_rows: np.ndarray, block_size: int, scale_search: str = "range") -> tuple[np.ndarray,
                                                                                                  np.ndarray]:
    """Rows (N, K) -> MatMulNBits 8-bit layout: (uint8 (N, K/bs, bs) with zero point 128, scales (N, K/bs)).

    One scale per block of `block_size` consecutive weights along K; K must be a multiple of it.
    scale_search "range": |max| / 127; "mse": the scale with the least squared error (scale_search.py).
    """
    n, k = w_rows.shape
    if k % block_size:
        raise ValueError(f"K={k} is not a multiple of block size {block_size}")
    blocks = w_rows.reshape(n, k // block_size, block_size)
    if scale_search == "mse":
        q, scale, _ = search_symmetric(blocks.astype(np.float32), 128, 128 - QMAX, 128 + QMAX, None, SYM_SHRINK_8BIT)
        return q.astype(np.uint8), scale
    if scale_search != "range":
        raise ValueError(f"unknown scale search {scale_search!r}")
    scale = _scale(np.abs(blocks).max(axis=-1))  # (N, K/bs)
    q = np.clip(np.rint(blocks / scale[..., None]), -QMAX, QMAX).astype(np.int16) + 128
    return q.astype(np.uint8), scale


def dequantize_blocks_u8(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Inverse of quantize_blocks_u8 -> rows (N, K) float32."""
    return ((q.astype(np.float32) - 128.0) * scale[..., None]).reshape(q.shape[0], -1)
