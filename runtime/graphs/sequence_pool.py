"""Sequence pools: the KV caches of a continuous batch, as the server's engine drives them (docs/design.md#serving).

A pool holds up to `capacity` sequences. The engine adds newcomers whose prompts fit one prefill run
together with `prefill_group` (one run for all of them), a longer prompt on its own with `prefill` (one
chunk per call of the generator, so running streams wait at most one chunk), decodes every joined
sequence together with `step`, and removes a sequence when it ends.

`SequentialPool` works for any graph variant: each sequence keeps its own batch-1 cache and a
step runs them one after another (no batching gain, but always correct). Variants with a
faster way override `GraphVariant.sequence_pool` (kv_buffer: `kv_buffer_pool.SlotPool`); `pool_for`
asks the variant first and falls back to SequentialPool, so the default lives here, beside the
interface it implements, and graph_variant.py needs nothing from this module.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Protocol

import numpy as np

from .graph_variant import DecodeState, GraphVariant

Prefill = Generator[None, None, np.ndarray]  # one run per next(); returns last-position logits (V,)


class SequencePool(Protocol):
    capacity: int

    def prefill(self, seq: int, prompt_ids: Sequence[int], chunk: int | None) -> Prefill:
        """Prefill a new sequence `seq` (the caller's id) and join it to the batch once done."""

    def prefill_group(self, seqs: Sequence[int], prompts: Sequence[Sequence[int]]) -> np.ndarray:
        """Prefill several new sequences at once and join them all -> last-position logits (k, V) float32."""

    def step(self, seqs: Sequence[int], tokens: np.ndarray) -> np.ndarray:
        """Feed one token per sequence (n,) -> next-token logits (n, V) float32, in `seqs` order."""

    def remove(self, seq: int) -> None:
        """Forget a sequence (finished, cancelled, or abandoned mid-prefill); its room is reused."""


def prefill_runs(length: int, chunk: int | None) -> list[tuple[int, int]]:
    """[(start, end)] prompt positions of each prefill run."""
    chunk = chunk or length
    return [(s, min(length, s + chunk)) for s in range(0, length, chunk)]


def drain(runs: Prefill) -> np.ndarray:
    """Run a prefill generator to its end -> its logits (V,)."""
    while True:
        try:
            next(runs)
        except StopIteration as done:
            return done.value


class SequentialPool:
    """Each sequence its own batch-1 DecodeState; step() runs them in turn."""

    def __init__(self, variant: GraphVariant, capacity: int, max_length: int):
        self.variant, self.capacity, self.max_length = variant, capacity, max_length
        self._states: dict[int, tuple[DecodeState, int]] = {}  # seq -> (cache, positions held)

    def prefill(self, seq: int, prompt_ids: Sequence[int], chunk: int | None) -> Prefill:
        state = self.variant.start(1, self.max_length)
        ids = np.asarray(prompt_ids, dtype=np.int64)[None]  # (1, L)
        logits = None
        for start, end in prefill_runs(ids.shape[1], self.variant.prefill_chunk(1, chunk)):
            logits = state.run(ids[:, start:end], np.ones((1, end), np.int64),
                               np.arange(start, end, dtype=np.int64)[None])[0].copy()
            if end < ids.shape[1]:
                yield
        self._states[seq] = (state, ids.shape[1])
        return logits

    def prefill_group(self, seqs: Sequence[int], prompts: Sequence[Sequence[int]]) -> np.ndarray:
        return np.stack([drain(self.prefill(seq, prompt, None)) for seq, prompt in zip(seqs, prompts, strict=True)])

    def step(self, seqs: Sequence[int], tokens: np.ndarray) -> np.ndarray:
        out = []
        for seq, tok in zip(seqs, tokens, strict=True):
            state, held = self._states[seq]
            logits = state.run(np.array([[tok]], np.int64), np.ones((1, held + 1), np.int64),
                               np.array([[held]], np.int64))
            out.append(logits[0].copy())
            self._states[seq] = (state, held + 1)
        return np.stack(out)

    def remove(self, seq: int) -> None:
        self._states.pop(seq, None)


def pool_for(variant: GraphVariant, capacity: int, max_length: int) -> SequencePool:
    """The pool of a continuous batch on this variant: its own (kv_buffer's SlotPool) or SequentialPool."""
    return variant.sequence_pool(capacity, max_length) or SequentialPool(variant, capacity, max_length)
