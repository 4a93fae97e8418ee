"""The pure sampling functions."""

from __future__ import annotations

import numpy as np
import pytest

from gptedge.runtime.errors import InvalidArgumentError
from gptedge.runtime.generation.sampling import (SamplingParams, apply_repetition_penalty, select_token, top_k_filter,
                                      top_p_filter)

LOGITS = np.array([2.0, 1.0, 0.5, -1.0, 3.0], dtype=np.float64)


def test_top_k_keeps_k_largest():
    out = top_k_filter(LOGITS, 2)
    assert np.isfinite(out).tolist() == [True, False, False, False, True]
    assert top_k_filter(LOGITS, 0) is LOGITS


def test_top_p_keeps_smallest_nucleus():
    probs = np.exp(LOGITS) / np.exp(LOGITS).sum()  # sorted: 3.0 (.61), 2.0 (.22), 1.0 (.08) ...
    assert probs[4] > 0.6
    assert np.isfinite(top_p_filter(LOGITS, 0.5)).tolist() == [False, False, False, False, True]
    assert np.isfinite(top_p_filter(LOGITS, 0.7)).tolist() == [True, False, False, False, True]
    assert np.isfinite(top_p_filter(LOGITS, 1e-9)).sum() == 1  # always at least the top token


def test_repetition_penalty_divides_positive_multiplies_negative():
    out = apply_repetition_penalty(LOGITS, np.array([0, 3, 0]), 2.0)
    assert out.tolist() == [1.0, 1.0, 0.5, -2.0, 3.0]
    assert LOGITS[0] == 2.0  # input untouched


def test_greedy_forms_and_seeded_sampling():
    rng = lambda: np.random.default_rng(7)  # noqa: E731 - a one-line local helper
    seen = np.array([], dtype=np.int64)
    for params in (SamplingParams(greedy=True), SamplingParams(temperature=0), SamplingParams(top_k=1)):
        assert select_token(LOGITS, params, rng(), seen) == 4
    p = SamplingParams(temperature=1.5, top_k=4, seed=7)
    draws = [select_token(LOGITS, p, r, seen) for r in [rng()] * 50]
    again = [select_token(LOGITS, p, r, seen) for r in [rng()] * 50]
    assert draws == again and len(set(draws)) > 1 and 3 not in draws  # top-k removed index 3


def test_sampling_follows_distribution():
    rng = np.random.default_rng(0)
    p = SamplingParams(temperature=1.0)
    draws = np.array([select_token(LOGITS, p, rng, np.array([])) for _ in range(4000)])
    want = np.exp(LOGITS) / np.exp(LOGITS).sum()
    got = np.bincount(draws, minlength=5) / len(draws)
    assert np.abs(got - want).max() < 0.03


@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": -1}, "temperature"), ({"temperature": float("nan")}, "temperature"),
    ({"top_k": -2}, "top_k"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"repetition_penalty": 0}, "repetition_penalty"), ({"seed": -1}, "seed"),
])
def test_invalid_parameters_raise(kwargs, message):
    with pytest.raises(InvalidArgumentError, match=message):
        SamplingParams(**kwargs)


def test_booleans_are_not_numbers():
    import pytest

    from gptedge.runtime.errors import InvalidArgumentError
    from gptedge.runtime.generation.sampling import SamplingParams

    for field in ("temperature", "top_k", "top_p", "repetition_penalty", "seed"):
        with pytest.raises(InvalidArgumentError, match=f"{field} must be a number, got True"):
            SamplingParams(**{field: True})
    with pytest.raises(InvalidArgumentError, match="greedy must be true or false"):
        SamplingParams(greedy=1)
