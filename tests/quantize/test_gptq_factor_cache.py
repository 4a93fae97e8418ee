"""GPTQ's per-input factors (quantize/gptq.py InverseFactor, factor_cache): a search's later candidates reuse the
first one's Hessians and factorisations and write exactly the bytes a fresh run writes; another text, or a run
outside the cache, measures again."""

from __future__ import annotations

import numpy as np
import pytest

from gptedge.quantize import gptq
from gptedge.quantize.quantizer import QuantizeRecipe, quantize_model_dir

from ..support.checkpoints import ROOT
from .test_gptq import dequantized, seeded_linear

CALIBRATION = (ROOT / "samples" / "calibration" / "emma_ch1-4.txt").read_text(encoding="utf-8")[:4000]


def test_a_precomputed_factor_rounds_exactly_as_the_hessian():
    x, w = seeded_linear(seed=3)
    h = x.T.astype(np.float64) @ x / len(x)
    h[:, 5] = h[5, :] = 0.0  # one dead input channel: the factor carries it
    factor = gptq.inverse_factor(h)
    assert factor.dead.tolist() == [i == 5 for i in range(h.shape[0])]
    for bits in (4, 8):
        want = gptq.gptq_rows(w, h, bits, 32)
        got = gptq.gptq_rows(w, None, bits, 32, factor=factor)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)
    assert not dequantized(*got)[:, 5].any()


def _data(d):
    return (d / "model.onnx.data").read_bytes() if (d / "model.onnx.data").exists() else (d / "model.onnx").read_bytes()


def test_the_second_candidate_reuses_the_factors_and_writes_the_same_bytes(gpt2_model_dir, tmp_path, monkeypatch):
    recipe = QuantizeRecipe("weight-only", bits=4, gptq=True, calibration_sequences=2, calibration_length=64)
    quantize_model_dir(gpt2_model_dir, tmp_path / "fresh", recipe, calibration_text=CALIBRATION)
    calls = []
    real = gptq.hessians
    monkeypatch.setattr(gptq, "hessians", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    with gptq.factor_cache(tmp_path / "factors") as folder:
        quantize_model_dir(gpt2_model_dir, tmp_path / "first", recipe, calibration_text=CALIBRATION)
        measured = len(calls)
        saved = sorted(p.name for p in folder.iterdir())
        quantize_model_dir(gpt2_model_dir, tmp_path / "second", recipe, calibration_text=CALIBRATION)
        assert len(calls) == measured > 0  # the second candidate measured nothing
        other = CALIBRATION[:2000] + " The end."
        quantize_model_dir(gpt2_model_dir, tmp_path / "other", recipe, calibration_text=other)
        assert len(calls) > measured  # another text: other windows, measured again
    inputs = {name for group in calls[:measured] for name in group}
    assert len(saved) == len(inputs)  # one factor per linear input
    assert _data(tmp_path / "first") == _data(tmp_path / "fresh") == _data(tmp_path / "second")
    quantize_model_dir(gpt2_model_dir, tmp_path / "outside", recipe, calibration_text=CALIBRATION)
    assert len(calls) > measured + 1  # outside the block nothing is kept


def test_the_cache_is_not_left_set_after_an_error(tmp_path):
    with pytest.raises(RuntimeError), gptq.factor_cache(tmp_path / "f"):
        raise RuntimeError("stop")
    assert gptq._FACTOR_FOLDER.get() is None
