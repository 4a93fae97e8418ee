"""Helpers of the serving engine's tests: a callback that collects a request's events, a bounded wait, and a
varied set of requests."""

from __future__ import annotations

import threading
import time

from gptedge.runtime.generation.sampling import SamplingParams
from gptedge.runtime.serving.engine import CompletionRequest

WAIT_S = 60  # every wait has a deadline: a regression fails the test, never hangs the suite

PROMPTS = ["Hello world", "It is a truth universally acknowledged that a single man in possession",
           "In", "The quick brown fox jumps over the lazy dog and then", "A"]
SETTINGS = [SamplingParams(greedy=True), SamplingParams(top_k=20, temperature=0.8, seed=7),
            SamplingParams(top_p=0.9, seed=3), SamplingParams(greedy=True, repetition_penalty=1.2)]


class Collector:
    def __init__(self):
        self.events, self.done = [], threading.Event()

    def __call__(self, event):
        self.events.append(event)
        if event.finish_reason:
            self.done.set()

    @property
    def last(self):
        return self.events[-1]

    def finished(self, timeout: float = WAIT_S) -> bool:
        return self.done.wait(timeout)


def wait_until(predicate, timeout: float = WAIT_S, poll_s: float = 0.005) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not true after {timeout}s"
        time.sleep(poll_s)


def staggered_requests(model, n):
    """n requests of varied prompts (1 to ~45 tokens), lengths, sampling settings and stop strings."""
    out = []
    for i in range(n):
        ids = model.encode(PROMPTS[i % len(PROMPTS)] * (1 + i % 3))  # prompts of 1 to ~45 tokens
        out.append(CompletionRequest(tuple(ids), max_new_tokens=8 + (i * 7) % 30, sampling=SETTINGS[i % 4],
                                     stop=(" the",) if i % 5 == 4 else ()))
    return out


def pool_greedy(model, prompt: list[int], new_tokens: int) -> list[int]:
    """Greedy ids through the serving engine's sequence pool alone (prefill into its row, then step it): what
    generate() gives for the same prompt, if the pool keeps the cache as generation does."""
    import numpy as np

    from gptedge.runtime.graphs.sequence_pool import drain, pool_for

    pool = pool_for(model.variant, 2, 64)
    got = [int(drain(pool.prefill(0, prompt, None)).argmax())]
    for _ in range(new_tokens - 1):
        got.append(int(pool.step([0], np.array([got[-1]]))[0].argmax()))
    return got
