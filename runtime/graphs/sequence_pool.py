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

Prompt logprobs (`echo` with `logprobs` on /v1/completions): a prefill asked to `keep_all` for a sequence runs the
LM head on every position of its run (logits_to_keep 0) and leaves that sequence's logits for each prompt position,
(L, V) float32, in `prompt_logits[seq]` for the engine to take; the ordinary return value is unchanged. Pools that
can do it say so with `keeps_prompt_logits`.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Protocol

import numpy as np

from .. import contract as C
from .graph_variant import DecodeState, GraphVariant

Prefill = Generator[None, None, np.ndarray]  # one run per next(); returns last-position logits (V,)


class SequencePool(Protocol):
    capacity: int
    keeps_prompt_logits: bool  # prefill / prefill_group take keep_all
    prompt_logits: dict[int, np.ndarray]  # seq -> (L, V) float32, left by a keep_all prefill

    def prefill(self, seq: int, prompt_ids: Sequence[int], chunk: int | None, *, keep_all: bool = False) -> Prefill:
        """Prefill a new sequence `seq` (the caller's id) and join it to the batch once done."""

    def prefill_group(self, seqs: Sequence[int], prompts: Sequence[Sequence[int]], *,
                      keep_all: Sequence[bool] = ()) -> np.ndarray:
        """Prefill several new sequences at once and join them all -> last-position logits (k, V) float32."""

    # A pool whose `reuses_prefixes` is true (the server's prefix cache, runtime/serving/prefix_cache.py) also
    # takes `prefix` in prefill (`prefixes` in prefill_group, one or None per prompt): the keys and values of
    # the prompt's first P positions, (2 x n_layer, kv heads, P, width), written into the sequence's cache so
    # that only positions P.. are run; and reads them back with read_kv(seq, start, end).

    def step(self, seqs: Sequence[int], tokens: np.ndarray) -> np.ndarray:
        """Feed one token per sequence (n,) -> next-token logits (n, V) float32, in `seqs` order. It may be a view
        that the pool's next step overwrites (kv_buffer's SlotPool): read it, or copy it, before the next step."""

    def remove(self, seq: int) -> None:
        """Forget a sequence (finished, cancelled, or abandoned mid-prefill); its room is reused."""


def prefill_runs(length: int, chunk: int | None, first: int = 0) -> list[tuple[int, int]]:
    """[(start, end)] prompt positions of each prefill run, from position `first` (those before it are cached)."""
    chunk = chunk or length - first
    return [(s, min(length, s + chunk)) for s in range(first, length, chunk)]


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
        # a standard graph's cache is the past it is fed (host arrays at first): a prefix is a past like any other
        self.reuses_prefixes = variant.name == C.GRAPH_STANDARD
        self.prompt_logits: dict[int, np.ndarray] = {}
        # the standard graph's state returns every position on request; kv_buffer's batch-1 states (a GPU
        # without a wide mask) bind a one-position logits buffer for the whole generation
        self.keeps_prompt_logits = variant.name == C.GRAPH_STANDARD

    def prefill(self, seq: int, prompt_ids: Sequence[int], chunk: int | None,
                prefix: np.ndarray | None = None, *, keep_all: bool = False) -> Prefill:
        if keep_all and not self.keeps_prompt_logits:
            raise RuntimeError(f"the {self.variant.name} graph's sequential pool does not keep prompt logits")
        if keep_all and prefix is not None:  # the engine never reuses a prefix whose logits are asked for
            raise RuntimeError("prompt logits need every position run: no cached prefix")
        state = self.variant.start(1, self.max_length)
        ids = np.asarray(prompt_ids, dtype=np.int64)[None]  # (1, L)
        cached = 0
        if prefix is not None:  # (2 x n_layer, nh, P, hs): the past of the prompt's first P positions
            state.set_past([kv[None] for kv in prefix])
            cached = prefix.shape[2]
        logits, kept = None, []
        for start, end in prefill_runs(ids.shape[1], self.variant.prefill_chunk(1, chunk), cached):
            feeds = (ids[:, start:end], np.ones((1, end), np.int64), np.arange(start, end, dtype=np.int64)[None])
            if keep_all:
                kept.append(state.run(*feeds, keep_all=True)[0].copy())  # (end - start, V)
                logits = kept[-1][-1]
            else:
                logits = state.run(*feeds)[0].copy()
            if end < ids.shape[1]:
                yield
        self._states[seq] = (state, ids.shape[1])
        if keep_all:
            self.prompt_logits[seq] = np.concatenate(kept)  # (L, V)
        return logits

    def prefill_group(self, seqs: Sequence[int], prompts: Sequence[Sequence[int]],
                      prefixes: Sequence[np.ndarray | None] | None = None, *,
                      keep_all: Sequence[bool] = ()) -> np.ndarray:
        prefixes = prefixes or [None] * len(seqs)
        keep = list(keep_all) or [False] * len(seqs)
        return np.stack([drain(self.prefill(seq, prompt, None, prefix, keep_all=k))
                         for seq, prompt, prefix, k in zip(seqs, prompts, prefixes, keep, strict=True)])

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
        self.prompt_logits.pop(seq, None)

    def read_kv(self, seq: int, start: int, end: int) -> np.ndarray:
        """Keys and values of positions [start, end) of a joined sequence, (2 x n_layer, nh, end - start, hs)."""
        return self._states[seq][0].read_kv(start, end)


def pool_for(variant: GraphVariant, capacity: int, max_length: int) -> SequencePool:
    """The pool of a continuous batch on this variant: its own (kv_buffer's SlotPool) or SequentialPool."""
    return variant.sequence_pool(capacity, max_length) or SequentialPool(variant, capacity, max_length)
