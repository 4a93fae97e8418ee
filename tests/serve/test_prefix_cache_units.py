"""The prefix cache's engine side (runtime/serving/prefix_cache.py) over a fake pool: which positions a prompt
reuses (both sides of a block's edge), what `take` returns, what `store` reads back, what /metrics shows.
Plain numbers, no model (test_prefix_reuse.py checks the same with real pools)."""

from __future__ import annotations

import numpy as np
import pytest

from gptedge.runtime.serving.prefix_cache import BLOCK, PrefixCache, PrefixReuse, block_keys


class FakePool:
    """read_kv(seq, start, end) -> (2, 1, end - start, 1) holding the positions' numbers, seq x 1000 + position."""

    def __init__(self):
        self.reads = []

    def read_kv(self, seq, start, end):
        self.reads.append((seq, start, end))
        pos = np.arange(start, end, dtype=np.float32) + 1000 * seq
        return np.broadcast_to(pos[None, None, :, None], (2, 1, end - start, 1)).copy()


def test_block_keys_edges():
    ids = list(range(3 * BLOCK))
    assert len(block_keys(ids[:BLOCK])) == 1 and block_keys(ids[:BLOCK - 1]) == ()
    assert len(block_keys(ids[:2 * BLOCK - 1])) == 1 and len(block_keys(ids[:2 * BLOCK])) == 2
    assert len(block_keys(ids, block=4)) == 12 and len(set(block_keys(ids, block=4))) == 12
    assert all(len(k) == 16 for k in block_keys(ids))
    assert block_keys(ids)[:2] == block_keys(ids[:2 * BLOCK])  # a key names its prefix, not the prompt's length


@pytest.mark.parametrize("cached_prompt, prompt, reusable", [
    (2 * BLOCK, 2 * BLOCK + 5, 2 * BLOCK),  # both blocks cached, the rest prefilled
    (2 * BLOCK, 2 * BLOCK + 1, 2 * BLOCK),  # one position left: it is prefilled
    (2 * BLOCK, 2 * BLOCK, 2 * BLOCK - 1),  # the whole prompt cached: its last position is still prefilled
    (BLOCK, 2 * BLOCK, BLOCK),  # only the first block cached
    (BLOCK - 1, 2 * BLOCK, 0),  # a partial block is never cached
])
def test_reusable_positions(cached_prompt, prompt, reusable):
    reuse = PrefixReuse(FakePool(), cap_bytes=1 << 20)
    ids = list(range(100, 100 + prompt))
    reuse.store(1, reuse.keys(ids[:cached_prompt]))
    assert reuse.reusable(ids, reuse.keys(ids)) == reusable


def test_take_returns_the_first_positions_and_counts_hits_and_misses():
    pool = FakePool()
    reuse = PrefixReuse(pool, cap_bytes=1 << 20)
    ids = list(range(3 * BLOCK))
    keys = reuse.keys(ids)
    reuse.store(7, keys)
    assert pool.reads == [(7, 0, BLOCK), (7, BLOCK, 2 * BLOCK), (7, 2 * BLOCK, 3 * BLOCK)]
    prefix = reuse.take(keys, BLOCK + 3)  # cuts the second block short
    assert prefix.shape == (2, 1, BLOCK + 3, 1) and prefix.flags.c_contiguous
    assert prefix[0, 0, :, 0].tolist() == [7000 + p for p in range(BLOCK + 3)]
    assert reuse.take(keys, 2 * BLOCK).shape[2] == 2 * BLOCK
    assert reuse.take(keys, 0) is None
    c = reuse.cache
    assert (c.hits, c.misses, c.saved_tokens) == (2, 1, 3 * BLOCK + 3)
    pool.reads.clear()
    reuse.store(8, keys)  # everything cached: nothing read again
    assert pool.reads == []
    reuse.store_finished(9, ids + list(range(BLOCK + 1)))  # the reply completed a fourth block
    assert pool.reads == [(9, 3 * BLOCK, 4 * BLOCK)] and len(c) == 4


def test_the_cap_holds_exactly_and_the_next_block_evicts():
    block = np.zeros((2, 1, BLOCK, 1), np.float32)  # 128 bytes
    keys = block_keys(list(range(3 * BLOCK)))
    cache = PrefixCache(cap_bytes=2 * block.nbytes)
    cache.add(keys[:2], [block, block])  # exactly the cap: both kept
    assert (len(cache), cache.bytes, cache.evictions) == (2, 2 * block.nbytes, 0)
    cache.add(keys, [block])  # one byte over would be passed: the least recently used goes
    assert (len(cache), cache.bytes, cache.evictions) == (2, 2 * block.nbytes, 1)
    exact = PrefixCache(cap_bytes=block.nbytes)  # a block exactly the cap is kept
    exact.add(keys[:1], [block])
    assert len(exact) == 1
    cache.add(keys, [block])  # already cached: not added twice
    assert cache.bytes == 2 * block.nbytes


def test_metrics_lines():
    cache = PrefixCache(cap_bytes=1000)
    cache.count(5)
    cache.count(0)
    cache.count(7)
    lines = cache.render()
    values = {ln.split()[0]: ln.split()[1] for ln in lines if not ln.startswith("#")}
    assert values == {"gptedge_prefix_cache_hits_total": "2", "gptedge_prefix_cache_misses_total": "1",
                      "gptedge_prefix_cache_saved_tokens_total": "12", "gptedge_prefix_cache_bytes": "0",
                      "gptedge_prefix_cache_evictions_total": "0"}
    assert lines[:3] == ["# HELP gptedge_prefix_cache_hits_total Admitted prompts that reused cached prefix blocks.",
                         "# TYPE gptedge_prefix_cache_hits_total counter", "gptedge_prefix_cache_hits_total 2"]
    assert [ln for ln in lines if ln.startswith("# TYPE")] == [
        "# TYPE gptedge_prefix_cache_hits_total counter", "# TYPE gptedge_prefix_cache_misses_total counter",
        "# TYPE gptedge_prefix_cache_saved_tokens_total counter", "# TYPE gptedge_prefix_cache_bytes gauge",
        "# TYPE gptedge_prefix_cache_evictions_total counter"]  # Prometheus reads a counter's rate, a gauge's value
    assert len(lines) == 15


def test_more_blocks_than_keys_is_an_error_not_a_misaligned_cache():
    block = np.zeros((2, 1, BLOCK, 1), np.float32)
    cache = PrefixCache(cap_bytes=1 << 20)
    with pytest.raises(ValueError):
        cache.add(block_keys(list(range(BLOCK))), [block, block])
