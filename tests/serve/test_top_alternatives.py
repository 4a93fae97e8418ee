"""The N most likely tokens a prompt position reports (runtime/serving/prompt_logprobs.py), on plain numbers at
each edge of N: 0, 1, fewer than the vocabulary, all of it, more than it."""

from __future__ import annotations

import numpy as np
import pytest

from gptedge.runtime.serving.prompt_logprobs import prompt_logprobs, top_alternatives

LOGP = np.log(np.array([0.1, 0.4, 0.05, 0.3, 0.15]))  # (V=5,): most likely first: 1, 3, 4, 0, 2


@pytest.mark.parametrize("n, ids", [(-1, []), (0, []), (1, [1]), (2, [1, 3]), (4, [1, 3, 4, 0]),
                                    (5, [1, 3, 4, 0, 2]), (6, [1, 3, 4, 0, 2])])
def test_the_n_most_likely_most_likely_first(n, ids):
    top = top_alternatives(LOGP, n)
    assert list(top) == ids
    assert all(isinstance(i, int) and top[i] == pytest.approx(LOGP[i]) for i in top)


def test_ties_keep_the_lower_id_first():
    top = top_alternatives(np.log(np.array([0.25, 0.25, 0.25, 0.25])), 4)
    assert list(top) == [0, 1, 2, 3]


def test_each_prompt_token_gets_its_own_logprob_and_its_positions_top():
    logits = np.array([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0], [0.0, 0.0, 0.0]], np.float32)  # (L=3, V=3)
    scored = prompt_logprobs(logits, [2, 1, 0], 2)
    lp0 = logits[0] - np.log(np.exp(logits[0]).sum())
    lp1 = logits[1] - np.log(np.exp(logits[1]).sum())
    assert scored.token_ids == (2, 1, 0) and all(type(i) is int for i in scored.token_ids)
    assert scored.logprobs[0] is None and scored.top[0] is None  # nothing predicts the first token
    assert scored.logprobs[1:] == pytest.approx([lp0[1], lp1[0]])  # position i's logits predict token i + 1
    assert scored.top[1] == pytest.approx({1: lp0[1], 2: lp0[2]}) and list(scored.top[1]) == [1, 2]
    assert list(scored.top[2]) == [0, 1]  # 0 first; 1 and 2 tie: the lower id
    for bad in (logits[:2], logits[0], logits[None]):  # one row short; (V,); (1, L, V)
        with pytest.raises(ValueError, match=r"^prompt logits .* do not match a prompt of 3 tokens$"):
            prompt_logprobs(bad, [2, 1, 0], 2)


def test_every_n_over_a_wide_vocabulary_equals_a_full_sort():
    logp = np.random.default_rng(3).normal(size=200)
    order = np.argsort(-logp, kind="stable")
    for n in range(1, 201):
        assert list(top_alternatives(logp, n)) == order[:n].tolist(), n


def test_the_single_most_likely_of_a_gpt2_sized_row_is_its_argmax():
    """n = 1 over a wide row (the partition's edge: a wrong kth picks an arbitrary token on rows this wide)."""
    for seed in range(5):
        logp = np.random.default_rng(seed).normal(size=50257)
        assert list(top_alternatives(logp, 1)) == [int(np.argmax(logp))]


def test_a_scored_prompt_is_an_immutable_value():
    import dataclasses

    scored = prompt_logprobs(np.zeros((2, 3), np.float32), [0, 1], 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        scored.logprobs = ()  # type: ignore[misc]
