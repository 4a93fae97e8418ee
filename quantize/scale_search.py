"""Error-aware scales and zero points for MatMulNBits blocks (recipe scale_search "mse"). Pure numpy.

The storage is the same as the plain search's (one float scale per block, a 4-bit zero point per block
where asymmetric, zero point 128 / 8 where symmetric): only the numbers chosen differ, so the graph and
the kernel that runs it are unchanged. Each block's (scale, zero point) minimises its squared error
over two steps:

1. a grid of clipping ratios: the plain search shrinks the range [min, max] from both ends together;
   here the low and the high end shrink independently (asymmetric), or the scale shrinks further
   (symmetric), since one outlier on one side should not cost the other side its resolution;
2. least-squares refits, as llama.cpp's k-quants do (make_qkx2_quants): with the levels q fixed, the
   best affine map w ~ a q + b is a closed form; its scale (and zero point, rounded to a level) are
   kept where re-rounding with them lowers the block's error.

A block's error never rises above the plain search's: its candidates are among the ones tried.
ONNX Runtime's own quantizers were not used: its DefaultWeightOnlyQuantizer rounds min-max ranges
(no search), and its HQQ quantizer fits float zero points (32 or 16 bits per block, not 4: another
layout), needs torch, and minimises an l_0.7 norm, not the squared error.
"""

from __future__ import annotations

import numpy as np

# Fractions of each end of the range (asymmetric) tried independently: 10 x 10 candidates per block.
END_SHRINK = np.linspace(1.0, 0.55, 10, dtype=np.float32)
# Fractions of the largest magnitude tried as the symmetric step's range.
SYM_SHRINK = np.linspace(1.0, 0.5, 26, dtype=np.float32)
SYM_SHRINK_8BIT = np.linspace(1.0, 0.8, 21, dtype=np.float32)
REFITS = 3


def _error(blocks: np.ndarray, q: np.ndarray, scale: np.ndarray, zp: np.ndarray) -> np.ndarray:
    return np.square((q - zp[..., None]) * scale[..., None] - blocks).sum(axis=-1)


def _round(blocks: np.ndarray, scale: np.ndarray, zp: np.ndarray, lo: int, hi: int) -> np.ndarray:
    return np.clip(np.rint(blocks / scale[..., None]) + zp[..., None], lo, hi)


class _Best:
    """The best (levels, scale, zero point) per block so far, by squared error."""

    def __init__(self, blocks: np.ndarray):
        self.blocks = blocks
        self.q = self.scale = self.zp = self.err = None

    def offer(self, q: np.ndarray, scale: np.ndarray, zp: np.ndarray) -> None:
        err = _error(self.blocks, q, scale, zp)
        if self.err is None:
            self.q, self.scale, self.zp, self.err = q, scale, zp, err
            return
        better = err < self.err
        self.q = np.where(better[..., None], q, self.q)
        self.scale, self.zp = np.where(better, scale, self.scale), np.where(better, zp, self.zp)
        self.err = np.minimum(err, self.err)


def _safe(scale: np.ndarray) -> np.ndarray:
    return np.where((scale == 0) | ~np.isfinite(scale), np.float32(1.0), scale).astype(np.float32)


def search_asymmetric(blocks: np.ndarray, levels: int = 16,
                      also: np.ndarray = END_SHRINK[:0]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """blocks (N, B, bs) -> (levels q (N, B, bs) float, scale (N, B), zero point (N, B) float in 0..levels-1).
    also: fractions tried for both ends together as well (the plain search's, so this one never does worse)."""
    top = levels - 1
    lo0 = np.minimum(blocks.min(axis=-1), 0.0)
    hi0 = np.maximum(blocks.max(axis=-1), 0.0)
    best = _Best(blocks)
    for a, b in [(f, f) for f in also] + [(a, b) for a in END_SHRINK for b in END_SHRINK]:
        lo, hi = lo0 * a, hi0 * b
        scale = _safe((hi - lo) / top)
        zp = np.clip(np.rint(-lo / scale), 0, top).astype(np.float32)
        best.offer(_round(blocks, scale, zp, 0, top), scale, zp)
    for _ in range(REFITS):  # w ~ scale * (q - zp): least squares in (scale, scale * zp), zp rounded to a level
        q = best.q
        qm, wm = q.mean(axis=-1), blocks.mean(axis=-1)
        var = np.square(q - qm[..., None]).sum(axis=-1)
        cov = ((q - qm[..., None]) * (blocks - wm[..., None])).sum(axis=-1)
        ok = (var > 0) & (cov > 0)
        scale = _safe(np.where(ok, cov / np.where(ok, var, 1.0), best.scale))
        zp = np.clip(np.rint(qm - wm / scale), 0, top).astype(np.float32)
        best.offer(_round(blocks, scale, zp, 0, top), scale, zp)
    return best.q, best.scale.astype(np.float32), best.zp


def search_symmetric(blocks: np.ndarray, zero_point: int, lo: int, hi: int, signed_max_to: float | None,
                     shrink: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A fixed zero point; levels lo..hi. signed_max_to: the level the block's largest-magnitude weight maps
    to (-8 for 4-bit, so its sign picks the scale's), or None: the scale is |max| / (hi - zero_point)."""
    if signed_max_to is not None:  # also the other way round: the largest weight on the short side's end level
        idx = np.abs(blocks).argmax(axis=-1)[..., None]
        signed = np.take_along_axis(blocks, idx, axis=-1)[..., 0]
        tops = [signed / signed_max_to, signed / (hi - zero_point)]
    else:
        tops = [np.abs(blocks).max(axis=-1) / (hi - zero_point)]
    zp = np.full(tops[0].shape, zero_point, np.float32)
    best = _Best(blocks)
    for top in tops:
        for s in shrink:
            scale = _safe(top * s)
            best.offer(_round(blocks, scale, zp, lo, hi), scale, zp)
    for _ in range(REFITS):  # w ~ scale * (q - zp) with zp fixed: scale = <q', w> / <q', q'>
        c = best.q - zp[..., None]
        den = np.square(c).sum(axis=-1)
        scale = _safe(np.where(den > 0, (c * blocks).sum(axis=-1) / np.where(den > 0, den, 1.0), best.scale))
        best.offer(_round(blocks, scale, zp, lo, hi), scale, zp)
    return best.q, best.scale.astype(np.float32), best.zp
