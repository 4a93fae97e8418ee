"""Automatic prefix reuse (runtime/serving/prefix_cache.py): a prompt that starts with blocks of an earlier one
takes their keys and values from the cache and prefills only the rest; greedy outputs are the same with and
without it, on both graph variants and an int8 cache, under a cap small enough to evict."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from gptedge.cli import main
from gptedge.runtime import load
from gptedge.runtime.errors import InvalidArgumentError
from gptedge.runtime.generation.sampling import SamplingParams
from gptedge.runtime.graphs.sequence_pool import drain, pool_for
from gptedge.runtime.modeldir.kv_cache import KV_CACHES
from gptedge.runtime.serving import engine as engine_module
from gptedge.runtime.serving.admission import PrefillPlan, plan_prefill
from gptedge.runtime.serving.engine import CompletionRequest, Engine
from gptedge.runtime.serving.prefix_cache import BLOCK, PrefixCache, block_keys

from ..support.checkpoints import ROOT, tiny_config, write_checkpoint
from ..support.engine import Collector
from .test_engine_prefill import RecordingPool  # a pool without reuses_prefixes

CONTEXT = 128  # the tiny model's
NEW = 8  # tokens generated per request
CALIBRATION = ROOT / "samples" / "calibration" / "emma_ch1-4.txt"


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    """One tiny seeded GPT-2 (std 0.3 weights, so greedy continuations vary and a wrong cached position shows) as a
    standard graph, a kv_buffer graph, and the kv_buffer graph with an int8 cache."""
    from gptedge.export.exporter import export_checkpoint
    from gptedge.export.reference import GPT
    from gptedge.quantize.quantizer import quantize_model_dir

    root = tmp_path_factory.mktemp("prefix-reuse")
    ck = write_checkpoint(GPT(tiny_config()).init_weights(3, std=0.3).eval(), root / "ck")
    export_checkpoint(ck, root / "standard", validate=False)
    export_checkpoint(ck, root / "kv_buffer", graph_variant="kv_buffer", validate=False)
    quantize_model_dir(root / "kv_buffer", root / "int8", None,
                       calibration_text=CALIBRATION.read_text(encoding="utf-8")[:20000], kv_cache="int8")
    return {name: root / name for name in ("standard", "kv_buffer", "int8")}


@pytest.fixture(scope="module")
def models(model_dirs) -> dict[str, object]:
    return {name: load(d, device="cpu") for name, d in model_dirs.items()}


def _ids(seed: int, n: int) -> list[int]:
    return [int(i) for i in np.random.default_rng(seed).integers(0, 50000, n)]


SYSTEM = _ids(1, 40)  # a shared "system prompt": two whole blocks and 8 positions
REQUEST_SETS = {
    "system prompt": [SYSTEM + _ids(10 + i, n) for i, n in enumerate((3, 12, 20, 1, 30))],
    "conversation": [_ids(2, 20), _ids(2, 20) + _ids(3, 15), _ids(2, 20) + _ids(3, 15) + _ids(4, 30),
                     _ids(2, 20) + _ids(3, 15) + _ids(4, 30) + _ids(5, 9)],
    # a prompt equal to a cached prefix, and prompts ending inside or at the edge of a cached block
    "equal prefixes": [SYSTEM[:32], SYSTEM[:32], SYSTEM[:16], SYSTEM[:17], SYSTEM[:33], SYSTEM[:31], SYSTEM[:32]],
}


def _request(prompt, new=NEW) -> CompletionRequest:
    return CompletionRequest(tuple(prompt), new, SamplingParams(greedy=True), ignore_eos=True)


def _solo(model, prompt, new=NEW) -> list[int]:
    return model.generate_batch([prompt], new, greedy=True, ignore_eos=True, with_text=False)[0].ids


def _one_after_another(engine: Engine, prompts) -> list[list[int]]:
    out = []
    for p in prompts:
        c = Collector()
        engine.submit(_request(p), c)
        assert c.finished()
        out.append(c.last.generation.ids)
    return out


def _expected_saved(prompts, outputs) -> int:
    """The oracle of the saved-token count when prompts come one after another and nothing is evicted: each
    prompt reuses the whole blocks it shares with the whole blocks an earlier request's row held (its prompt and
    every generated token but the last), all but its last position at most. Computed from the ids, not from the
    cache's keys."""
    held = [list(p) + list(out[:-1]) for p, out in zip(prompts, outputs, strict=True)]
    saved = 0
    for i, p in enumerate(prompts):
        best = 0
        for q in held[:i]:
            common = next((k for k, (a, b) in enumerate(zip(p, q, strict=False)) if a != b), min(len(p), len(q)))
            best = max(best, min(common, len(q)) // BLOCK * BLOCK)
        saved += min(best, len(p) - 1)
    return saved


# -- the pieces, on plain data -----------------------------------------------------------------------------------
def test_block_keys_name_a_whole_prefix():
    a, b = _ids(7, 50), _ids(7, 50)
    b[20] += 1  # differs inside the second block
    ka, kb = block_keys(a), block_keys(b)
    assert len(ka) == 50 // BLOCK == 3  # a trailing partial block has no key
    assert ka[0] == kb[0] and ka[1] != kb[1] and ka[2] != kb[2]  # chained: a difference reaches every later key
    assert block_keys(a[:BLOCK] + a[:BLOCK])[1] != ka[0]  # the same ids after another prefix are another block
    assert block_keys(a[:BLOCK - 1]) == ()


def test_the_cache_evicts_least_recently_used_blocks_deepest_first_under_its_cap():
    block = np.zeros((2, 1, BLOCK, 4), np.float32)  # 512 bytes
    cache = PrefixCache(cap_bytes=3 * block.nbytes)
    first, second = block_keys(_ids(1, 48)), block_keys(_ids(2, 48))
    cache.add(first, [block.copy() for _ in first])
    assert (len(cache), cache.bytes, cache.cached_blocks(first)) == (3, 3 * block.nbytes, 3)
    cache.add(second[:1], [block.copy()])  # a fourth block: the first prompt's deepest goes, its parents stay
    assert (cache.cached_blocks(first), cache.cached_blocks(second), cache.evictions) == (2, 1, 1)
    cache.take(first[:2])  # now the most recent: the next eviction takes the second prompt's block
    cache.add(second[:2], [block.copy()])
    assert (cache.cached_blocks(first), cache.cached_blocks(second), cache.evictions) == (2, 0, 2)
    assert cache.bytes == 3 * block.nbytes
    small = PrefixCache(cap_bytes=block.nbytes - 1)  # a block larger than the cap is never kept
    small.add(first[:1], [block])
    assert (len(small), small.bytes) == (0, 0)


@pytest.mark.parametrize("waiting, budget, plan", [
    ([(100, 96), (100, 96)], 16, PrefillPlan(2, reused=(96, 96))),  # each runs 4 positions: 2 x 4 <= 16
    ([(100, 96), 10], 16, PrefillPlan(1, reused=(96,))),  # a fresh 10-token prompt after it: 2 x 10 > 16
    ([(100, 64)], 16, PrefillPlan(1, chunked=True, reused=(64,))),  # 36 positions left: chunked
    ([(100, 0), (20, 0)], None, PrefillPlan(2)),  # nothing reused: the plan of plain lengths
])
def test_admission_counts_only_the_positions_a_prompt_still_runs(waiting, budget, plan):
    assert plan_prefill(False, waiting, 0, 8, budget) == plan


# -- the pools ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["standard", "kv_buffer", "int8"])
def test_a_pool_prefilled_over_a_cached_prefix_holds_what_a_full_prefill_holds(models, name):
    model, prompt = models[name], _ids(5, 60)
    full = pool_for(model.variant, 2, CONTEXT)
    want = drain(full.prefill(0, prompt, None))
    split = pool_for(model.variant, 2, CONTEXT)
    got = drain(split.prefill(1, prompt, 16, full.read_kv(0, 0, 48)))  # the rest in a chunk of 16 and one of 12
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert full.read_kv(0, 0, 60).dtype == model.variant.kv_dtype
    np.testing.assert_array_equal(split.read_kv(1, 0, 48), full.read_kv(0, 0, 48))
    np.testing.assert_allclose(split.read_kv(1, 48, 60).astype(np.float32),
                               full.read_kv(0, 48, 60).astype(np.float32), atol=1e-5)


@pytest.mark.parametrize("name", ["standard", "kv_buffer", "int8"])
def test_a_group_of_fresh_and_reused_prompts_decodes_as_each_alone(models, name):
    """One prefill_group where the middle prompt starts from a cached prefix and the others from nothing, then
    decode steps of all three: each row's greedy ids are its solo ones."""
    model = models[name]
    prompts = [_ids(30, 20), SYSTEM + _ids(31, 9), _ids(32, 5)]
    donor = pool_for(model.variant, 1, CONTEXT)
    drain(donor.prefill(0, SYSTEM, None))
    pool = pool_for(model.variant, 3, CONTEXT)
    tokens = pool.prefill_group([0, 1, 2], prompts, [None, donor.read_kv(0, 0, 32), None]).argmax(-1)
    got = [[int(t)] for t in tokens]
    for _ in range(NEW - 1):
        tokens = pool.step([0, 1, 2], tokens).argmax(-1)
        for ids, t in zip(got, tokens, strict=True):
            ids.append(int(t))
    assert got == [_solo(model, p) for p in prompts]


# -- the engine --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["standard", "kv_buffer", "int8"])
@pytest.mark.parametrize("request_set", list(REQUEST_SETS))
def test_greedy_outputs_are_the_same_with_and_without_reuse(models, name, request_set):
    model, prompts = models[name], REQUEST_SETS[request_set]
    engine = Engine(model, max_batch=4, prefill_chunk=24).start()  # long rests are chunked, short ones grouped
    try:
        got = _one_after_another(engine, prompts)
        cache = engine.prefix.cache
        assert (cache.hits, cache.misses, cache.saved_tokens) == (len(prompts) - 1, 1, _expected_saved(prompts, got))
    finally:
        engine.stop(1)
    assert got == [_solo(model, p) for p in prompts]


@pytest.mark.parametrize("name", ["standard", "kv_buffer", "int8"])
def test_reused_prompts_decode_in_a_batch_with_unrelated_rows(models, name):
    """Unrelated long rows keep decoding while shared-prefix newcomers join, in groups and in chunks: every row
    gets its solo greedy ids."""
    model = models[name]
    unrelated = [(_ids(20 + i, n), 40) for i, n in enumerate((9, 50, 23))]
    shared = [(p, NEW) for s in REQUEST_SETS.values() for p in s]
    engine = Engine(model, max_batch=5, max_queue=64, prefill_chunk=40)
    rows = [(p, new, Collector()) for p, new in unrelated + shared]
    for p, new, c in rows[:len(unrelated)]:  # a burst before the engine starts: prefilled as a group
        engine.submit(_request(p, new), c)
    engine.start()
    try:
        for p, new, c in rows[len(unrelated):]:  # arriving while those decode
            engine.submit(_request(p, new), c)
        for _, _, c in rows:
            assert c.finished()
        assert engine.prefix.cache.saved_tokens > 0
    finally:
        engine.stop(1)
    for p, new, c in rows:
        assert c.last.generation.ids == _solo(model, p, new), p


@pytest.mark.parametrize("name", ["standard", "kv_buffer", "int8"])
def test_the_next_turn_of_a_conversation_reuses_the_reply(models, name):
    """A finished request's row (its prompt and the tokens it generated, all but the last) is cached too: a next
    prompt that sends the reply back reuses its whole blocks, and decodes its solo ids."""
    model = models[name]
    first = SYSTEM  # 40 positions + 23 of the 24 generated ones fed back: the row holds 63, three whole blocks (the
    # 64th position, the last token, was never run: a cache that claimed a fourth block would hand out garbage)
    engine = Engine(model, max_batch=2, prefill_chunk=24).start()
    try:
        c = Collector()
        engine.submit(_request(first, 24), c)
        assert c.finished()
        reply = c.last.generation.ids
        following = first + reply + _ids(40, 5)
        assert _one_after_another(engine, [following]) == [_solo(model, following)]
        assert engine.prefix.cache.saved_tokens == 3 * BLOCK  # 48 > the 32 of the prompt's own blocks
    finally:
        engine.stop(1)


def test_eviction_under_a_tiny_cap_keeps_outputs_right(models):
    model = models["kv_buffer"]
    shape = model.manifest.shape
    block_bytes = BLOCK * KV_CACHES["fp32"].bytes_per_position(shape.n_layer, shape.n_head, shape.head_dim)
    prompts = [p for s in REQUEST_SETS.values() for p in s] * 2
    engine = Engine(model, max_batch=2, prefill_chunk=24, prefix_cache_mb=3 * block_bytes / 2**20).start()
    try:
        got = _one_after_another(engine, prompts)
        cache = engine.prefix.cache
        assert cache.evictions > 0 and cache.hits > 0 and cache.bytes <= 3 * block_bytes and len(cache) <= 3
    finally:
        engine.stop(1)
    assert got == [_solo(model, p) for p in prompts]


def test_metrics_lines_and_off_switches(models, monkeypatch):
    model = models["standard"]
    engine = Engine(model, max_batch=2).start()
    try:
        _one_after_another(engine, REQUEST_SETS["system prompt"][:2])
        text = "\n".join(engine.metrics.render())
    finally:
        engine.stop(1)
    for line in ("gptedge_prefix_cache_hits_total 1", "gptedge_prefix_cache_misses_total 1",
                 "gptedge_prefix_cache_saved_tokens_total 32", "gptedge_prefix_cache_evictions_total 0",
                 "# TYPE gptedge_prefix_cache_bytes gauge"):
        assert line in text
    # four blocks: the first row's three (43 prompt + 7 generated positions), the second prompt's third
    shape = model.manifest.shape
    four = 4 * BLOCK * KV_CACHES["fp32"].bytes_per_position(shape.n_layer, shape.n_head, shape.head_dim)
    assert f"\ngptedge_prefix_cache_bytes {four}\n" in text
    assert Engine(model, prefix_cache_mb=0).prefix is None
    assert "prefix_cache" not in "\n".join(Engine(model, prefix_cache_mb=0).metrics.render())
    with pytest.raises(InvalidArgumentError, match="prefix_cache_mb must be a number >= 0"):
        Engine(model, prefix_cache_mb=-1)
    # a pool that cannot start a sequence from a cached prefix (the GPU's DeviceSlotPool): reuse is off
    monkeypatch.setattr(engine_module, "pool_for", lambda *a: RecordingPool(pool_for(*a)))
    assert Engine(model).prefix is None


def test_serve_prefix_cache_mb_option(model_dirs, tmp_path):
    """The real server with --prefix-cache-mb: the startup line states it and /metrics counts a hit; a bad value
    exits 2 with its range before anything loads."""
    from ..support.server import start_server, stop_server

    httpx = pytest.importorskip("httpx")
    bad = CliRunner().invoke(main, ["serve", str(tmp_path), "--prefix-cache-mb", "-1"])
    assert bad.exit_code == 2 and "'--prefix-cache-mb': -1 is not in the range" in bad.output
    server = start_server(model_dirs["kv_buffer"], tmp_path / "serve.log", "--device", "cpu", "--prefix-cache-mb", "1")
    try:
        assert "prefix cache 1 MiB" in (tmp_path / "serve.log").read_text()
        for prompt in REQUEST_SETS["system prompt"][:2]:
            r = httpx.post(f"{server.url}/v1/completions", timeout=60,
                           json={"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0})
            assert r.status_code == 200, r.text
        metrics = server.metrics()
        assert (metrics["gptedge_prefix_cache_hits_total"], metrics["gptedge_prefix_cache_saved_tokens_total"]) == \
            (1, 32)
    finally:
        stop_server(server.proc)
