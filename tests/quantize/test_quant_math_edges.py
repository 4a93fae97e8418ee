"""Quantization math at its edges: all-zero and tiny blocks, the reduced range, exact levels, the
row chunking and the zero-point padding. Expected values are worked out by hand from the docstrings' layouts."""

from __future__ import annotations

import numpy as np
import pytest

import gptedge.quantize.int8_math as qm
import gptedge.quantize.nbit_math as nm


def test_int8_every_column_uses_its_whole_range_and_zero_columns_stay_zero():
    w = np.array([[0.5, 0.0, -0.001, 3.0], [-0.25, 0.0, 0.0005, -1.5]], np.float32)  # (K=2, N=4)
    q, s = qm.quantize_columns(w)
    assert np.allclose(s, [0.5 / 127, 1.0, 0.001 / 127, 3.0 / 127]) and s.dtype == np.float32
    assert q[:, 0].tolist() == [127, -64] and q[:, 1].tolist() == [0, 0] and q[:, 2].tolist() == [-127, 64]
    assert q[:, 3].tolist() == [127, -64]
    q7, s7 = qm.quantize_columns(w, qmax=qm.QMAX_REDUCED)
    assert qm.QMAX == 127 and qm.QMAX_REDUCED == 63 and np.abs(q7).max() == 63 and s7[0] == pytest.approx(0.5 / 63)
    qt, st = qm.quantize_columns(w, per_channel=False)
    assert np.allclose(st, 3.0 / 127) and qt[:, 3].tolist() == [127, -64] and qt[0, 0] == round(0.5 / (3 / 127))
    assert qm.quantize_columns(np.zeros((2, 2), np.float32), per_channel=False)[1].tolist() == [1.0, 1.0]


def test_int8_rows_are_the_transpose_and_clip_symmetrically():
    e = np.array([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0]], np.float32)  # (V=2, C=3)
    q, s = qm.quantize_rows(e)
    assert q.shape == (2, 3) and s.shape == (2,) and q[0].tolist() == [64, -127, 32] and q[1].tolist() == [0, 0, 0]
    assert s.tolist() == pytest.approx([2.0 / 127, 1.0])
    q, _ = qm.quantize_columns(np.array([[-1.0], [1.0]], np.float32))
    assert q[:, 0].tolist() == [-127, 127]  # -x quantizes exactly like x


def test_int8_blocks_zero_point_128_and_bad_block_sizes():
    w = np.array([[1.0, -1.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0]], np.float32)  # one row, two blocks of 4
    q, s = qm.quantize_blocks_u8(w, 4)
    assert q.dtype == np.uint8 and q.tolist() == [[[255, 1, 128, 192], [128, 128, 128, 128]]]
    assert s[0].tolist() == pytest.approx([1 / 127, 1.0])
    assert np.allclose(qm.dequantize_blocks_u8(q, s), [[1.0, -1.0, 0.0, 0.5039, 0, 0, 0, 0]], atol=1e-3)
    with pytest.raises(ValueError, match="K=8 is not a multiple of block size 3"):
        qm.quantize_blocks_u8(w, 3)


def test_nibbles_low_first_and_back():
    q = np.array([[1, 2, 15, 0]], np.uint8)
    assert nm.pack_nibbles(q).tolist() == [[0x21, 0x0F]]
    assert nm.unpack_nibbles(np.array([[0x21, 0x0F]], np.uint8)).tolist() == q.tolist()
    assert nm.unpack_nibbles(np.array([[0xFF]], np.uint8)).tolist() == [[15, 15]]


def test_4bit_symmetric_levels_by_hand():
    w = np.array([[4.0, -2.0, 1.0, 0.0]], np.float32)  # largest magnitude +4 -> level 0: scale 4 / -8 = -0.5
    b, s, z = nm.quantize_4bit(w, 4, symmetric=True, search=False)
    assert z is None and s.tolist() == [[-0.5]]
    assert nm.unpack_nibbles(b).tolist() == [[[0, 12, 6, 8]]]  # 4/-0.5 + 8 = 0, -2/-0.5 + 8 = 12, ...
    assert nm.dequantize_4bit(b, s).tolist() == [[4.0, -2.0, 1.0, 0.0]]
    b, s, _ = nm.quantize_4bit(np.zeros((1, 4), np.float32), 4, symmetric=True, search=False)
    assert s.tolist() == [[1.0]] and nm.unpack_nibbles(b).tolist() == [[[8, 8, 8, 8]]]


def test_4bit_asymmetric_levels_by_hand():
    w = np.array([[1.5, 0.0, -0.0, 0.7], [-3.0, 0.0, -1.4, 0.0]], np.float32)
    b, s, z = nm.quantize_4bit(w, 4, symmetric=False, search=False)
    assert s[:, 0].tolist() == pytest.approx([0.1, 0.2])  # (max(hi, 0) - min(lo, 0)) / 15
    zp = nm.unpack_nibbles(z)[:, 0]
    assert zp.tolist() == [0, 15]  # -lo / scale: 0, and 3.0 / 0.2
    assert nm.unpack_nibbles(b).tolist() == [[[15, 0, 0, 7]], [[0, 15, 8, 15]]]
    assert np.allclose(nm.dequantize_4bit(b, s, z), w, atol=1e-6)
    _, s, z = nm.quantize_4bit(np.zeros((1, 4), np.float32), 4, symmetric=False, search=False)
    assert s.tolist() == [[1.0]]


def test_4bit_search_never_loses_and_clips_an_outlier():
    w = np.array([[1.0, 0.9, -0.8, 0.7, -0.6, 0.5, 0.4, 9.0]], np.float32)
    for symmetric in (True, False):
        full = nm.dequantize_4bit(*nm.quantize_4bit(w, 8, symmetric, search=False))
        best = nm.dequantize_4bit(*nm.quantize_4bit(w, 8, symmetric, search=True))
        assert np.square(best - w).sum() < np.square(full - w).sum()  # a narrower range wins here
    assert nm.SHRINK[0] == 1.0 and nm.SHRINK[-1] == pytest.approx(0.70) and len(nm.SHRINK) == 13


def test_4bit_zero_points_of_an_odd_block_count_are_padded_with_8():
    w = np.random.default_rng(0).normal(size=(2, 12)).astype(np.float32)  # 3 blocks of 4
    b, s, z = nm.quantize_4bit(w, 4, symmetric=False)
    assert b.shape == (2, 3, 2) and s.shape == (2, 3) and z.shape == (2, 2)
    assert (nm.unpack_nibbles(z)[:, 3] == 8).all()
    assert np.abs(nm.dequantize_4bit(b, s, z) - w).max() <= np.abs(s).max()


def test_4bit_rows_in_chunks_equal_rows_at_once(monkeypatch):
    w = np.random.default_rng(1).normal(size=(10, 8)).astype(np.float32)
    for symmetric in (True, False):
        whole = nm.quantize_4bit(w, 4, symmetric)
        monkeypatch.setattr(nm, "ROW_CHUNK", 3)
        parts = nm.quantize_4bit(w, 4, symmetric)
        monkeypatch.setattr(nm, "ROW_CHUNK", 4096)
        for a, b in zip(whole, parts, strict=True):
            assert (a is None and b is None) or (a.shape == b.shape and (a == b).all())


def test_4bit_block_sizes_that_do_not_fit_are_refused():
    for bs in (3, 5):
        with pytest.raises(ValueError, match=f"block size {bs}"):
            nm.quantize_4bit(np.zeros((1, 15), np.float32), bs)
    with pytest.raises(ValueError, match="K=12 is not a multiple of block size 8"):
        nm.quantize_4bit(np.zeros((1, 12), np.float32), 8)
