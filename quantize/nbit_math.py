"""4-bit block quantization in MatMulNBits' layout, apart from the graph surgery. Pure numpy.

Layout (ONNX Runtime contrib op com.microsoft.MatMulNBits, bits=4), for a weight given as rows
W (N, K), i.e. the transpose of a MatMul's (K, N) initializer:

- B: uint8 (N, K/bs, bs/2); the weights of one block, in K order, two per byte, the even one in
  the low nibble, the odd one in the high nibble;
- scales: float (N, K/bs);
- zero_points (asymmetric only): uint8 (N, ceil((K/bs)/2)), the zero points of one row's blocks
  packed the same way (low nibble first); absent means 8 for every block.

A weight dequantizes as (q - zero_point) * scale. tests/quantize/test_int4.py checks a MatMulNBits node
against `dequantize_4bit` followed by a numpy matmul: that test is the oracle for this packing.
"""

from __future__ import annotations

import numpy as np

from . import scale_search as ss

LEVELS = 16  # 0..15
SYMMETRIC_ZERO_POINT = 8
# Each block tries these fractions of its full range and keeps the one with the least squared error:
# clipping the one or two largest weights of a block often buys a finer step for the other thirty.
SHRINK = np.linspace(1.0, 0.70, 13, dtype=np.float32)
# Rows (output channels) are quantized independently, this many at a time: the search's temporaries
# are ~6x its input, ~2 GB at once for GPT-2 XL's tied embedding (50,257 x 1,600) if done whole.
ROW_CHUNK = 4096


def pack_nibbles(q: np.ndarray) -> np.ndarray:
    """uint8 values 0..15, last axis of even length -> two per byte along it (low nibble first)."""
    q = q.astype(np.uint8)
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def unpack_nibbles(packed: np.ndarray) -> np.ndarray:
    """Inverse of pack_nibbles: (..., n) uint8 -> (..., 2n) uint8 values 0..15."""
    out = np.empty(packed.shape[:-1] + (2 * packed.shape[-1],), np.uint8)
    out[..., 0::2] = packed & 0x0F
    out[..., 1::2] = packed >> 4
    return out


def _blocks(w_rows: np.ndarray, block_size: int) -> np.ndarray:
    n, k = w_rows.shape
    if k % block_size or block_size % 2:
        raise ValueError(f"K={k} is not a multiple of block size {block_size}")
    return w_rows.astype(np.float32).reshape(n, k // block_size, block_size)


def _symmetric(blocks: np.ndarray, shrink: float) -> tuple[np.ndarray, np.ndarray]:
    """Zero point 8: the weight of largest magnitude maps to -8 (so its sign picks the scale's sign) and
    all 16 levels are in use, as in llama.cpp's Q4_0; -> (scale, zero point) per block."""
    idx = np.abs(blocks).argmax(axis=-1)[..., None]
    signed_max = np.take_along_axis(blocks, idx, axis=-1)[..., 0]
    scale = (signed_max * shrink / -8.0).astype(np.float32)
    scale = np.where(scale == 0, np.float32(1.0), scale)
    zp = np.full(scale.shape, SYMMETRIC_ZERO_POINT, np.float32)
    return scale, zp


def _asymmetric(blocks: np.ndarray, shrink: float) -> tuple[np.ndarray, np.ndarray]:
    """Range [min, max] (widened to hold 0) over 15 steps; zero point rounded to a level 0..15."""
    lo = np.minimum(blocks.min(axis=-1), 0.0) * shrink
    hi = np.maximum(blocks.max(axis=-1), 0.0) * shrink
    scale = ((hi - lo) / (LEVELS - 1)).astype(np.float32)
    scale = np.where(scale == 0, np.float32(1.0), scale)
    zp = np.clip(np.rint(-lo / scale), 0, LEVELS - 1).astype(np.float32)
    return scale, zp


def quantize_4bit(w_rows: np.ndarray, block_size: int, symmetric: bool = True, search: bool = True,
                  scale_search: str = "range") -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Rows (N, K) -> (B uint8 (N, K/bs, bs/2), scales float32 (N, K/bs), zero_points uint8 (N, ceil(K/bs/2)) or None).

    One scale (and, asymmetric, one zero point) per block of `block_size` consecutive weights along K.
    With `search`, each block keeps the range fraction in SHRINK with the least squared error;
    scale_search "mse": scale_search.py's wider search and least-squares refits instead (same layout).
    """
    if w_rows.shape[0] > ROW_CHUNK:  # the same result, in slices of rows
        parts = [quantize_4bit(w_rows[i:i + ROW_CHUNK], block_size, symmetric, search, scale_search)
                 for i in range(0, w_rows.shape[0], ROW_CHUNK)]
        return tuple(None if p[0] is None else np.concatenate(p) for p in zip(*parts, strict=True))
    return pack_levels(*grid_4bit(_blocks(w_rows, block_size), symmetric, search, scale_search), symmetric)


def grid_4bit(blocks: np.ndarray, symmetric: bool, search: bool = True,
              scale_search: str = "range") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Blocks (N, B, bs) float32 -> (levels q (N, B, bs) float 0..15, scale (N, B), zero point (N, B) float): what
    quantize_4bit packs, unpacked (gptq.py rounds its updated weights on this grid, block by block)."""
    if scale_search == "mse":
        if symmetric:
            shrink = np.union1d(ss.SYM_SHRINK, SHRINK)
            return ss.search_symmetric(blocks, SYMMETRIC_ZERO_POINT, 0, LEVELS - 1, -8.0, shrink)
        return ss.search_asymmetric(blocks, LEVELS, also=SHRINK)
    if scale_search != "range":
        raise ValueError(f"unknown scale search {scale_search!r}")
    best_q = best_scale = best_zp = best_err = None
    for shrink in (SHRINK if search else SHRINK[:1]):
        scale, zp = (_symmetric if symmetric else _asymmetric)(blocks, float(shrink))
        q = np.clip(np.rint(blocks / scale[..., None]) + zp[..., None], 0, LEVELS - 1)
        err = np.square((q - zp[..., None]) * scale[..., None] - blocks).sum(axis=-1)
        if best_err is None:
            best_q, best_scale, best_zp, best_err = q, scale, zp, err
        else:
            better = err < best_err
            best_q = np.where(better[..., None], q, best_q)
            best_scale, best_zp = np.where(better, scale, best_scale), np.where(better, zp, best_zp)
            best_err = np.minimum(err, best_err)
    return best_q, best_scale, best_zp


def pack_levels(best_q: np.ndarray, best_scale: np.ndarray, best_zp: np.ndarray,
          symmetric: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    packed = pack_nibbles(best_q.astype(np.uint8))
    if symmetric:
        return packed, best_scale.astype(np.float32), None
    zp = best_zp.astype(np.uint8)
    if zp.shape[-1] % 2:
        zp = np.concatenate([zp, np.full(zp.shape[:-1] + (1,), SYMMETRIC_ZERO_POINT, np.uint8)], axis=-1)
    return packed, best_scale.astype(np.float32), pack_nibbles(zp)


def dequantize_4bit(packed: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None = None) -> np.ndarray:
    """Inverse of quantize_4bit -> rows (N, K) float32."""
    n, n_blocks, _ = packed.shape
    q = unpack_nibbles(packed).astype(np.float32)  # (N, K/bs, bs)
    if zero_points is None:
        zp = np.full((n, n_blocks), SYMMETRIC_ZERO_POINT, np.float32)
    else:
        zp = unpack_nibbles(zero_points)[:, :n_blocks].astype(np.float32)
    return ((q - zp[..., None]) * scales[..., None]).reshape(n, -1).astype(np.float32)
