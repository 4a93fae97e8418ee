"""Sampling at its boundaries: exact ties at the top-p edge, every parameter's edge values, and every
token-selection path off the greedy one. The oracles are written out here from the README's and the docstrings'
promises (top-p keeps "the smallest set of most likely tokens whose probability sums to >= p"), never by calling
the code under test."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from gptedge.runtime.errors import InvalidArgumentError
from gptedge.runtime.generation.sampling import (SamplingParams, apply_repetition_penalty, select_token, softmax,
                                      top_k_filter, top_p_filter)


def kept(filtered: np.ndarray) -> list[int]:
    return np.flatnonzero(np.isfinite(filtered)).tolist()


# -- top-p: exact ties --------------------------------------------------------------------------------------------
# Four equal logits: each token has probability exactly 1/4 (no rounding: exp(0) / 4), so the mass before the
# i-th token is exactly i/4. The smallest set reaching p = 1/2 is two tokens; a `<=` at the edge would keep three.
@pytest.mark.parametrize("p, n", [(0.25, 1), (0.5, 2), (0.75, 3), (0.2500001, 2), (0.7499999, 3), (1e-9, 1)])
def test_top_p_keeps_the_smallest_set_reaching_p_with_exact_ties(p, n):
    assert kept(top_p_filter(np.zeros(4), p)) == list(range(n))  # ties go in index order (a stable sort)


def test_top_p_edge_with_unequal_powers_of_two():
    logits = np.log(np.array([0.5, 0.25, 0.125, 0.125]))  # mass before each: 0, .5, .75, .875
    assert kept(top_p_filter(logits, 0.5)) == [0]
    assert kept(top_p_filter(logits, 0.75)) == [0, 1]
    assert kept(top_p_filter(logits, 0.76)) == [0, 1, 2]
    order = np.array([2, 0, 3, 1])  # the same distribution shuffled: the kept set follows the logits, not the index
    assert kept(top_p_filter(logits[order], 0.75)) == [1, 3]


def test_top_p_of_one_is_off_and_filtered_logits_keep_their_values():
    logits = np.array([0.3, -2.0, 1.5])
    assert top_p_filter(logits, 1.0) is logits
    out = top_p_filter(logits, 0.5)
    assert out[2] == 1.5 and np.isneginf(out[[0, 1]]).all()


# -- top-k and repetition penalty at their edges ------------------------------------------------------------------
def test_top_k_edges_and_ties():
    logits = np.array([1.0, 3.0, 3.0, 2.0, 0.0])
    assert kept(top_k_filter(logits, 1)) == [1, 2]  # ties at the k-th value all stay
    assert kept(top_k_filter(logits, 3)) == [1, 2, 3]
    assert kept(top_k_filter(logits, 4)) == [0, 1, 2, 3]
    assert top_k_filter(logits, 5) is logits and top_k_filter(logits, 9) is logits  # k >= V: nothing to filter
    assert top_k_filter(logits, 2)[3] == -np.inf and top_k_filter(logits, 2)[1] == 3.0


def test_repetition_penalty_edges():
    logits = np.array([2.0, -2.0, 0.0, 4.0])
    assert apply_repetition_penalty(logits, [], 2.0) is logits  # nothing seen
    assert apply_repetition_penalty(logits, [0, 1], 1.0) is logits  # off
    assert apply_repetition_penalty(logits, [0, 1, 2, 0, 0], 4.0).tolist() == [0.5, -8.0, 0.0, 4.0]  # once each
    assert apply_repetition_penalty(logits, [3], 0.5).tolist() == [2.0, -2.0, 0.0, 8.0]  # < 1 encourages


# -- every selection path off the greedy one ---------------------------------------------------------------------
def draws(logits, params, n=3000, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.array([select_token(logits, params, rng, [0]) for _ in range(n)])


def frequencies(d: np.ndarray, v: int) -> np.ndarray:
    return np.bincount(d, minlength=v) / len(d)


def test_temperature_reshapes_the_distribution():
    logits = np.log(np.array([0.6, 0.3, 0.1]))
    for t in (0.5, 2.0):
        want = np.array([0.6, 0.3, 0.1]) ** (1 / t)
        got = frequencies(draws(logits, SamplingParams(temperature=t)), 3)
        assert np.abs(got - want / want.sum()).max() < 0.035, (t, got)


def test_repetition_penalty_acts_when_sampling_too():
    logits = np.array([1.0, 1.0])  # token 0 is in `seen`: its logit 1.0 becomes 1/3
    got = frequencies(draws(logits, SamplingParams(repetition_penalty=3.0)), 2)
    want0 = math.exp(1 / 3) / (math.exp(1 / 3) + math.e)
    assert abs(got[0] - want0) < 0.03


def test_greedy_with_a_repetition_penalty_takes_the_penalised_argmax():
    logits = np.array([3.0, 2.0, -1.0], dtype=np.float32)  # seen: token 0 -> 3 / 2 = 1.5 < 2
    for params in (SamplingParams(greedy=True, repetition_penalty=2.0),
                   SamplingParams(temperature=0, repetition_penalty=2.0),
                   SamplingParams(top_k=1, repetition_penalty=2.0)):
        assert select_token(logits, params, np.random.default_rng(0), [0]) == 1


def test_top_k_then_top_p_both_apply_when_sampling():
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1]))
    got = set(draws(logits, SamplingParams(top_k=3, top_p=0.6), n=400).tolist())
    assert got == {0, 1}  # top-k leaves 3; renormalised (.44, .33, .22), top-p 0.6 keeps 2
    got = set(draws(logits, SamplingParams(top_k=3), n=400).tolist())
    assert got == {0, 1, 2}
    got = set(draws(logits, SamplingParams(top_p=0.65), n=400).tolist())
    assert got == {0, 1}


def test_a_tiny_temperature_is_the_argmax_and_a_large_one_near_uniform():
    logits = np.array([0.0, 5.0, 4.9])
    assert set(draws(logits, SamplingParams(temperature=1e-310), n=50).tolist()) == {1}
    for negative in (np.array([-1.0]), np.array([-3.0, -1.0, -2.0])):  # scaled to -inf, not +inf (hypothesis found it)
        assert set(draws(negative, SamplingParams(temperature=2.2e-309), n=20).tolist()) == {len(negative) // 2}
    got = frequencies(draws(logits, SamplingParams(temperature=1e6)), 3)
    assert np.abs(got - 1 / 3).max() < 0.04


def test_a_seed_makes_sampling_reproducible_and_another_seed_differs():
    logits = np.zeros(50)
    p = SamplingParams(temperature=1.0)
    assert draws(logits, p, 40, seed=3).tolist() == draws(logits, p, 40, seed=3).tolist()
    assert draws(logits, p, 40, seed=3).tolist() != draws(logits, p, 40, seed=4).tolist()


def test_softmax_is_a_distribution_even_for_huge_logits():
    p = softmax(np.array([1000.0, 1000.0, 0.0]))
    assert np.allclose(p, [0.5, 0.5, 0.0]) and abs(p.sum() - 1) < 1e-12


# -- the parameters' edges: the documented ranges include their ends ------------------------------------------------
@pytest.mark.parametrize("kwargs", [dict(temperature=0), dict(temperature=0.0), dict(top_k=0), dict(top_p=1.0),
                                    dict(top_p=1e-12), dict(repetition_penalty=1e-9), dict(seed=0), dict(seed=None),
                                    dict(greedy=False), dict(top_k=10**9)])
def test_edge_values_are_accepted(kwargs):
    SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=float("inf")), "temperature"), (dict(temperature="1"), "temperature"),
    (dict(top_k=1.0), "top_k"), (dict(top_k=-1), "top_k"), (dict(top_p=-0.1), "top_p"),
    (dict(top_p=float("nan")), "top_p"), (dict(top_p=1.0000001), "top_p"), (dict(top_p="0.5"), "top_p"),
    (dict(repetition_penalty=float("inf")), "repetition_penalty"), (dict(repetition_penalty=-1), "repetition_penalty"),
    (dict(repetition_penalty="2"), "repetition_penalty"), (dict(seed=1.5), "seed"), (dict(seed="7"), "seed"),
    (dict(greedy=None), "greedy"), (dict(greedy="yes"), "greedy"),
])
def test_values_just_outside_are_refused(kwargs, message):
    with pytest.raises(InvalidArgumentError, match=f"^{message} must be"):
        SamplingParams(**kwargs)


def test_sampling_params_are_frozen():
    params = SamplingParams(top_k=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.top_k = 4  # options travel with each call; nobody changes them on the way


def test_only_the_three_greedy_forms_are_greedy():
    assert SamplingParams(greedy=True).is_greedy and SamplingParams(temperature=0).is_greedy
    assert SamplingParams(top_k=1).is_greedy
    for params in (SamplingParams(), SamplingParams(top_k=2), SamplingParams(temperature=1e-3),
                   SamplingParams(top_p=0.01)):
        assert not params.is_greedy
