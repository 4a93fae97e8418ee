"""A prompt's own log-probabilities, from the logits its prefill kept for every position (docs/serving.md).

`echo: true` with `logprobs: N` on /v1/completions asks for them (lm-evaluation-harness scores a continuation
so). The prefill run of such a request keeps the LM head's output at every prompt position (the pools'
`keep_all`, logits_to_keep 0), and this module turns those logits into what the API reports: position i's
logits predict token i + 1, so the first prompt token has no logprob (None, as OpenAI's API gave) and token
i + 1 gets log_softmax(logits[i])[token i + 1], with the N most likely tokens there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..generation.evaluate import log_softmax


@dataclass(frozen=True)
class PromptLogprobs:
    """Per prompt token (L of them): its logprob and its position's top alternatives (token id -> logprob, most
    likely first); both None for the first token, which nothing predicts."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float | None, ...]
    top: tuple[dict[int, float] | None, ...]


def top_alternatives(logp: np.ndarray, n: int) -> dict[int, float]:
    """The n most likely tokens of one position's log-probabilities (V,), most likely first."""
    if n <= 0:
        return {}
    best = np.argpartition(-logp, n - 1)[:n] if n < logp.shape[0] else np.arange(logp.shape[0])
    return {int(i): float(logp[i]) for i in best[np.argsort(-logp[best], kind="stable")]}


def prompt_logprobs(logits: np.ndarray, prompt_ids: Sequence[int], top_n: int) -> PromptLogprobs:
    """logits (L, V) of a prompt of L tokens (each position's next-token logits) -> its PromptLogprobs."""
    ids = np.asarray(prompt_ids, dtype=np.int64)
    if logits.ndim != 2 or logits.shape[0] != len(ids):
        raise ValueError(f"prompt logits {logits.shape} do not match a prompt of {len(ids)} tokens")
    logprobs: list[float | None] = [None]
    top: list[dict[int, float] | None] = [None]
    for i in range(1, len(ids)):  # a row at a time: (V,) float64, never (L, V) of them
        logp = log_softmax(logits[i - 1][None])[0]
        logprobs.append(float(logp[ids[i]]))
        top.append(top_alternatives(logp, top_n))
    return PromptLogprobs(tuple(int(i) for i in ids), tuple(logprobs), tuple(top))
