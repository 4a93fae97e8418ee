"""Automatic prefix reuse: the keys and values of prompt blocks seen before, kept under a memory cap
(docs/serving.md#prefix-reuse).

A prompt is cut into blocks of BLOCK tokens. Block j is keyed by a hash of every id up to and including it
(chained: hash(key of block j-1, ids of block j)), so one key names a whole prefix and two prompts share a key
exactly when they share that many blocks of ids. Each cached block holds its positions' keys and values for
every layer, one array (2 x n_layer, kv heads, BLOCK, width) in the pool's cache type, in the order the graph's
past inputs come (layer 0 key, layer 0 value, ...); an int8 or int4 cache is copied as stored (its scales are
per channel, constant), so a block is exact whatever the cache type.

The engine asks `PrefixReuse` four things: at admission, how many positions of a waiting prompt are cached
(`reusable`: the longest run of cached blocks, but never the whole prompt: at least one position is prefilled,
so the row has logits); when the prompt is admitted, those blocks (`take`: they become most recently used, and
are counted as a hit or a miss); once it is prefilled, its blocks not yet cached, read from the pool's row
(`store`); and when it ends, the blocks its generated tokens completed (`store_finished`). Blocks are evicted
least recently used first when the bytes held would pass the cap; a prefix's blocks are touched deepest first,
so the deepest (least shared) block of a prefix goes before its parents and an evicted parent never strands its
children for long.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

BLOCK = 16  # tokens per block: a shared system prompt loses at most 15 positions; a block is one dict entry

Block = np.ndarray  # (2 x n_layer, kv heads, BLOCK, width) in the cache's type


def block_keys(prompt_ids: Sequence[int], block: int = BLOCK) -> tuple[bytes, ...]:
    """The chained key of each whole block of the prompt (a trailing partial block has none)."""
    keys, parent = [], b""
    for start in range(0, len(prompt_ids) - block + 1, block):
        ids = np.asarray(prompt_ids[start:start + block], dtype=np.int64).tobytes()
        parent = hashlib.blake2b(parent + ids, digest_size=16).digest()
        keys.append(parent)
    return tuple(keys)


class PrefixCache:
    """Blocks by key, least recently used first, under `cap_bytes`. Used by the engine thread; /metrics reads
    the counters from another thread, under the lock."""

    def __init__(self, cap_bytes: int, block: int = BLOCK):
        self.cap_bytes, self.block = cap_bytes, block
        self._blocks: OrderedDict[bytes, Block] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = self.misses = self.saved_tokens = self.evictions = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def cached_blocks(self, keys: Sequence[bytes]) -> int:
        """How many of the leading keys are cached (no block becomes more recent)."""
        n = 0
        while n < len(keys) and keys[n] in self._blocks:
            n += 1
        return n

    def take(self, keys: Sequence[bytes]) -> list[Block]:
        """The blocks of these keys (every one cached), made the most recently used, the first block last."""
        with self._lock:
            for key in reversed(keys):
                self._blocks.move_to_end(key)
            return [self._blocks[k] for k in keys]

    def add(self, keys: Sequence[bytes], blocks: Sequence[Block]) -> None:
        """A prompt's blocks: keys of all its whole blocks, blocks for the last len(blocks) of them (the ones
        not cached yet). While the cap would be passed the least recently used blocks are evicted; a block
        larger than the whole cap is not kept. Then the prompt's blocks are touched deepest first."""
        with self._lock:
            for key, block in zip(keys[len(keys) - len(blocks):], blocks, strict=True):
                if key in self._blocks or block.nbytes > self.cap_bytes:
                    continue
                while self.bytes + block.nbytes > self.cap_bytes:
                    _, old = self._blocks.popitem(last=False)
                    self.bytes -= old.nbytes
                    self.evictions += 1
                self._blocks[key] = block
                self.bytes += block.nbytes
            for key in reversed(keys):
                if key in self._blocks:
                    self._blocks.move_to_end(key)

    def count(self, reused: int) -> None:
        with self._lock:
            if reused:
                self.hits += 1
                self.saved_tokens += reused
            else:
                self.misses += 1

    def render(self) -> list[str]:
        """Prometheus lines, named as runtime/serving/metrics.py names the engine's."""
        with self._lock:
            rows = [
                ("hits_total", "counter", "Admitted prompts that reused cached prefix blocks.", self.hits),
                ("misses_total", "counter", "Admitted prompts that found no cached prefix block.", self.misses),
                ("saved_tokens_total", "counter", "Prompt positions taken from the prefix cache, not prefilled.",
                 self.saved_tokens),
                ("bytes", "gauge", "Bytes of keys and values the prefix cache holds.", self.bytes),
                ("evictions_total", "counter", "Prefix blocks evicted, least recently used first.", self.evictions),
            ]
        lines = []
        for suffix, kind, help_text, value in rows:
            name = f"gptedge_prefix_cache_{suffix}"
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {value}"]
        return lines


class PrefixReuse:
    """The engine's side of the cache, over one sequence pool (one that `reuses_prefixes`: it takes a prefix in
    prefill / prefill_group and reads a joined sequence's keys and values back with read_kv)."""

    def __init__(self, pool, cap_bytes: int, block: int = BLOCK):
        self.pool, self.cache = pool, PrefixCache(cap_bytes, block)

    def keys(self, prompt_ids: Sequence[int]) -> tuple[bytes, ...]:
        """The prompt's block keys: computed once, in the submitting thread."""
        return block_keys(prompt_ids, self.cache.block)

    def reusable(self, prompt_ids: Sequence[int], keys: Sequence[bytes]) -> int:
        """Leading positions of the prompt held by cached blocks, at most all but its last (which is prefilled,
        so the row has logits)."""
        return min(self.cache.cached_blocks(keys) * self.cache.block, len(prompt_ids) - 1)

    def take(self, keys: Sequence[bytes], reused: int) -> np.ndarray | None:
        """An admitted prompt's cached prefix: keys and values of its first `reused` positions,
        (2 x n_layer, kv heads, reused, width), or None when it reuses nothing. Counted as a hit or a miss."""
        self.cache.count(reused)
        if not reused:
            return None
        n_blocks = -(-reused // self.cache.block)  # those holding the positions: the last one may be cut short
        prefix = np.concatenate(self.cache.take(keys[:n_blocks]), axis=2)  # (2 x n_layer, nh, n_blocks x BLOCK, w)
        return np.ascontiguousarray(prefix[:, :, :reused])

    def store(self, seq: int, keys: Sequence[bytes]) -> None:
        """A prompt just prefilled (sequence `seq`, joined): its whole blocks not cached yet, read from its row."""
        have, block = self.cache.cached_blocks(keys), self.cache.block
        blocks = [self.pool.read_kv(seq, j * block, (j + 1) * block) for j in range(have, len(keys))]
        self.cache.add(keys, blocks)

    def store_finished(self, seq: int, held_ids: Sequence[int]) -> None:
        """A sequence that ended, before its row goes: the ids its cache holds (the prompt and every generated
        token but the last, which was never fed) -> their whole blocks, so a conversation's next turn, which
        sends the reply back, reuses it too."""
        self.store(seq, self.keys(held_ids))
