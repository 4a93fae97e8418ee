"""Token selection: small pure numpy functions over one row of logits (V,)."""

from __future__ import annotations

import numpy as np

from .generation_options import SamplingParams


def apply_repetition_penalty(logits: np.ndarray, seen, penalty: float) -> np.ndarray:
    """Divide positive / multiply negative logits of tokens in `seen` (ids) by `penalty`."""
    if penalty == 1.0 or len(seen) == 0:
        return logits
    out = logits.copy()
    ids = np.unique(np.asarray(seen, dtype=np.int64))
    vals = out[ids]
    out[ids] = np.where(vals > 0, vals / penalty, vals * penalty)
    return out


def top_k_filter(logits: np.ndarray, k: int) -> np.ndarray:
    """Keep the k largest logits, -inf elsewhere."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = np.partition(logits, -k)[-k]
    return np.where(logits >= kth, logits, -np.inf)


def top_p_filter(logits: np.ndarray, p: float) -> np.ndarray:
    """Keep the smallest set of most likely tokens whose probability sums to >= p (at least one)."""
    if p >= 1.0:
        return logits
    order = np.argsort(-logits, kind="stable")
    probs = softmax(logits[order])
    keep_sorted = (np.cumsum(probs) - probs) < p  # a token stays if the mass before it is < p
    keep = np.zeros_like(keep_sorted)
    keep[order] = keep_sorted
    return np.where(keep, logits, -np.inf)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - np.max(x))
    return e / e.sum()


def select_token(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator, seen) -> int:
    """One token id from logits (V,) float32; `seen` are the ids so far (prompt + generated)."""
    if params.is_greedy and params.repetition_penalty == 1.0:
        return int(np.argmax(logits))  # the hot path of greedy decoding: no copy, no float64
    logits = apply_repetition_penalty(logits.astype(np.float64, copy=False), seen, params.repetition_penalty)
    if params.is_greedy:
        return int(np.argmax(logits))
    with np.errstate(over="ignore"):
        scaled = logits / params.temperature
    if not np.isfinite(scaled.max()):  # a temperature so small that scaling overflows (to -inf too, when every
        return int(np.argmax(logits))  # logit is negative): all mass on the top logit
    logits = top_p_filter(top_k_filter(scaled, params.top_k), params.top_p)
    return int(rng.choice(logits.shape[-1], p=softmax(logits)))
