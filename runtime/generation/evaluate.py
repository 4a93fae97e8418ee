"""Perplexity over a whole text with a sliding window, and the per-position logits it is built from."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidArgumentError

Progress = Callable[[int, int], None]  # (done, total) in tokens


@dataclass(frozen=True)
class Window:
    begin: int  # input ids[begin:end]
    end: int
    first_target: int  # targets ids[first_target:end] are scored in this window


def sliding_windows(n_tokens: int, context: int, stride: int | None = None) -> list[Window]:
    """Windows of at most `context` tokens; every token after the first is scored exactly once,
    with at least context - stride tokens before it once the first window is past."""
    if n_tokens < 2:
        raise InvalidArgumentError(f"text has {n_tokens} token(s); perplexity needs at least 2")
    if stride is None:  # 0 is refused below, like any stride outside 1..context: never "the default"
        stride = max(1, context // 2)
    if not 0 < stride <= context:
        raise InvalidArgumentError(f"stride must be in 1..{context}, got {stride}")
    windows, scored, begin = [], 1, 0
    while scored < n_tokens:
        end = min(begin + context, n_tokens)
        windows.append(Window(begin, end, scored))
        scored = end
        # The next window keeps context - stride tokens of history, and always at least one.
        begin = max(0, min(end - context + stride, end - 1))
    return windows


def window_logits(model, ids: list[int], window: Window) -> tuple[np.ndarray, np.ndarray]:
    """-> (logits (n, V) predicting each scored target, targets (n,)) for one window."""
    x = np.asarray(ids[window.begin:window.end], dtype=np.int64)[None]  # (1, L)
    logits, _ = model.forward(x, np.ones_like(x), np.arange(x.shape[1], dtype=np.int64)[None], model.empty_past(1))
    first = window.first_target - window.begin  # position of the first scored target in the window
    return logits[0, first - 1:-1], np.asarray(ids[window.first_target:window.end], dtype=np.int64)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """(n, V) -> float64 log-probabilities."""
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def scored_logits(model, ids: list[int], stride: int | None = None,
                  progress: Progress | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    windows = sliding_windows(len(ids), model.manifest.shape.context_length, stride)
    for w in windows:
        yield window_logits(model, ids, w)
        if progress:
            progress(w.end - 1, len(ids) - 1)


@dataclass
class Perplexity:
    perplexity: float
    tokens: int  # targets scored
    nll: float  # mean negative log-likelihood (nats)
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {"perplexity": self.perplexity, "tokens": self.tokens, "nll": self.nll, "seconds": self.seconds,
                "tokens_per_s": self.tokens_per_s}


def perplexity(model, ids: list[int], stride: int | None = None, progress: Progress | None = None) -> Perplexity:
    started = time.perf_counter()
    total, count = 0.0, 0
    for logits, targets in scored_logits(model, ids, stride, progress):
        logp = log_softmax(logits)
        total -= float(logp[np.arange(len(targets)), targets].sum())
        count += len(targets)
    nll = total / count
    return Perplexity(math.exp(nll), count, nll, time.perf_counter() - started)
