"""Prompt logprobs (`echo` with `logprobs`): computed in the prefill run, equal to the fp32 PyTorch reference's
log_softmax within 1e-5, on both graph variants, alone, chunked and in a batch with other rows; max_tokens 0; the
HTTP shapes (OpenAI's legacy completions: the first token's logprob null, text_offset into the echoed text)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gptedge.runtime.generation.sampling import SamplingParams
from gptedge.runtime.generation.text_stream import TextStream, token_offsets
from gptedge.runtime.serving.engine import CompletionRequest, Engine, FinishReason
from gptedge.runtime.serving.prompt_logprobs import prompt_logprobs
from ..support.checkpoints import tiny_reference
from ..support.engine import Collector

TOLERANCE = 1e-5
GREEDY = SamplingParams(greedy=True)
TEXTS = ["It is a truth universally acknowledged, that a single man", "Hello world", "In",
         "The quick brown fox jumps over the lazy dog again and again"]


@pytest.fixture(scope="module")
def reference():
    """The fp32 PyTorch model the tiny checkpoint was written from (conftest: tiny_reference("gpt2"), seed 0)."""
    return tiny_reference("gpt2")


def reference_logprobs(reference, ids: list[int]) -> np.ndarray:
    """(L, V) float64 log-probabilities of each position's next token under the fp32 reference."""
    import torch

    with torch.no_grad():
        logits = reference(torch.tensor([ids]))[0][0]  # (L, V) fp32
    return torch.log_softmax(logits.double(), dim=-1).numpy()


def check_against_reference(reference, ids: list[int], scored, top_n: int) -> None:
    expected = reference_logprobs(reference, ids)
    assert scored.token_ids == tuple(ids)
    assert scored.logprobs[0] is None and scored.top[0] is None  # nothing predicts the first token
    got = np.array(scored.logprobs[1:])
    want = expected[np.arange(len(ids) - 1), ids[1:]]
    assert got.shape == want.shape and np.all(np.abs(got - want) < TOLERANCE)  # a one-token prompt: none to check
    for i in range(1, len(ids)):
        assert len(scored.top[i]) == top_n
        best = np.argsort(-expected[i - 1], kind="stable")[:top_n]
        assert list(scored.top[i]) == [int(t) for t in best]
        assert max(abs(scored.top[i][int(t)] - expected[i - 1][t]) for t in best) < TOLERANCE


def _run(model, requests, **engine_options):
    engine = Engine(model, max_batch=8, max_queue=64, **engine_options)
    got = [Collector() for _ in requests]
    for r, c in zip(requests, got, strict=True):  # all queued before the engine starts: one burst, one group
        engine.submit(r, c)
    engine.start()
    try:
        for c in got:
            assert c.finished()
    finally:
        engine.stop(grace_s=1)
    return got


@pytest.fixture(params=["standard", "kv_buffer"])
def model(request, gpt2_loaded, gpt2_kv_buffer_loaded):
    return gpt2_loaded if request.param == "standard" else gpt2_kv_buffer_loaded


def test_prompt_logprobs_alone_equal_the_reference(model, reference):
    ids = model.encode(TEXTS[0])
    (c,) = _run(model, [CompletionRequest(tuple(ids), 0, GREEDY, prompt_logprobs=3)])
    assert len(c.events) == 1  # max_tokens 0: the prompt scored, nothing generated
    event = c.last
    assert event.finish_reason == FinishReason.LENGTH and event.token_id is None and event.generation.ids == []
    check_against_reference(reference, ids, event.prompt_logprobs, 3)


@pytest.mark.parametrize("budget", [None, 5])  # one group run; chunks of 5 (the long prompts prefilled alone)
def test_prompt_logprobs_in_a_mixed_batch(model, reference, budget):
    """Rows with and without prompt logprobs, of several lengths, in one burst: every scored prompt equals the
    reference and every row's tokens equal its run alone."""
    prompts = [model.encode(t) for t in TEXTS]
    requests = [CompletionRequest(tuple(p), 4, GREEDY, logprobs=1, ignore_eos=True,
                                  prompt_logprobs=2 if i % 2 == 0 else None) for i, p in enumerate(prompts)]
    together = _run(model, requests, prefill_chunk=budget)
    for i, (request, c) in enumerate(zip(requests, together, strict=True)):
        scored = [e.prompt_logprobs for e in c.events if e.prompt_logprobs is not None]
        if request.prompt_logprobs is None:
            assert scored == []
        else:
            assert len(scored) == 1 and c.events[0].prompt_logprobs is scored[0]  # on the first event
            check_against_reference(reference, prompts[i], scored[0], 2)
        (alone,) = _run(model, [CompletionRequest(request.prompt_ids, 4, GREEDY, ignore_eos=True)])
        assert c.last.generation.ids == alone.last.generation.ids


def test_prompt_logprobs_from_logits_match_a_direct_log_softmax():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 11)).astype(np.float32) * 4
    ids = [3, 1, 4, 1, 5]
    scored = prompt_logprobs(logits, ids, 11)
    direct = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum(-1, keepdims=True))
    assert scored.logprobs[0] is None
    assert np.allclose(scored.logprobs[1:], direct[np.arange(4), ids[1:]], atol=1e-12)
    assert all(list(t.values()) == sorted(t.values(), reverse=True) and len(t) == 11 for t in scored.top[1:])
    with pytest.raises(ValueError, match="do not match"):
        prompt_logprobs(logits[:4], ids, 1)


def test_the_engine_refuses_prompt_logprobs_where_its_pool_cannot(gpt2_loaded):
    from gptedge.runtime.errors import InvalidArgumentError

    engine = Engine(gpt2_loaded, max_batch=2)
    engine.pool.keeps_prompt_logits = False
    with pytest.raises(InvalidArgumentError, match="do not compute prompt logprobs"):
        engine.submit(CompletionRequest((1, 2), 0, prompt_logprobs=1), Collector())
    with pytest.raises(InvalidArgumentError, match="max_new_tokens"):  # 0 only with prompt logprobs
        engine.submit(CompletionRequest((1, 2), 0), Collector())


# -- one owner of a request's text (issue 33) --------------------------------------------------------------------
def test_token_offsets_leave_an_incomplete_character_out(gpt2_loaded):
    tokenizer = gpt2_loaded.tokenizer
    ids = gpt2_loaded.encode("caf\u00e9 \U0001f600 ok")  # the emoji is split over several byte-level tokens
    offsets = token_offsets(tokenizer, ids)
    stream = TextStream(tokenizer)
    streamed = []
    for tok in ids:
        stream.push(tok)
        streamed.append(stream.last_offset)
    assert offsets == streamed  # the echo's rule and the generated text's rule are one
    text = gpt2_loaded.decode(ids)
    assert offsets == sorted(offsets) and offsets[-1] <= len(text)
    assert all(text.startswith(tokenizer.decode(ids[:i])) for i in range(len(ids)) if offsets[i] == len(
        tokenizer.decode(ids[:i])))


# -- HTTP ---------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def client(gpt2_kv_buffer_loaded):
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from gptedge.serve.app import ServeState, create_app
    from gptedge.serve.routes import Generating

    engine = Engine(gpt2_kv_buffer_loaded, max_batch=4, max_queue=32, prefill_chunk=16).start()
    state = ServeState(Generating(engine, gpt2_kv_buffer_loaded, 64), "tiny")
    with TestClient(create_app(state), raise_server_exceptions=False) as c:
        yield c
    engine.stop(grace_s=1)


def _complete(client, **body):
    r = client.post("/v1/completions", json={"model": "tiny", **body})
    assert r.status_code == 200, r.text
    return r.json()


def _stream(client, **body) -> list[dict]:
    with client.stream("POST", "/v1/completions", json={"model": "tiny", "stream": True, **body}) as r:
        assert r.status_code == 200
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_echo_with_logprobs_over_http(client, gpt2_kv_buffer_loaded, reference):
    model = gpt2_kv_buffer_loaded
    prompt = TEXTS[0]
    ids = model.encode(prompt)
    body = _complete(client, prompt=prompt, echo=True, logprobs=2, max_tokens=3, temperature=0, ignore_eos=True)
    (choice,) = body["choices"]
    lp = choice["logprobs"]
    assert choice["text"].startswith(prompt) and len(lp["tokens"]) == len(ids) + 3
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    expected = reference_logprobs(reference, ids)
    got = np.array(lp["token_logprobs"][1:len(ids)])
    assert np.abs(got - expected[np.arange(len(ids) - 1), ids[1:]]).max() < TOLERANCE
    assert all(len(t) == 2 for t in lp["top_logprobs"][1:])
    # the tokens are the text, each at its offset (ASCII text: no character split over tokens)
    assert "".join(lp["tokens"]) == choice["text"]
    assert all(choice["text"][o:o + len(t)] == t for t, o in zip(lp["tokens"], lp["text_offset"], strict=True))
    assert body["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 3, "total_tokens": len(ids) + 3}
    # streamed: the echo chunk carries the prompt's logprobs, then one chunk per token; the same numbers
    chunks = _stream(client, prompt=prompt, echo=True, logprobs=2, max_tokens=3, temperature=0, ignore_eos=True)
    streamed = {k: [] for k in lp}
    for chunk in chunks:
        block = chunk["choices"][0]["logprobs"]
        for k in streamed:
            streamed[k].extend(block[k] if block else [])
    assert streamed == lp
    assert "".join(c["choices"][0]["text"] for c in chunks) == choice["text"]


def test_max_tokens_0_returns_the_scored_prompt_only(client, gpt2_kv_buffer_loaded):
    ids = gpt2_kv_buffer_loaded.encode(TEXTS[1])
    for prompt in (TEXTS[1], ids):  # text or token ids, as lm-evaluation-harness sends them
        body = _complete(client, prompt=prompt, echo=True, logprobs=0, max_tokens=0)
        (choice,) = body["choices"]
        assert choice["text"] == TEXTS[1] and choice["finish_reason"] == "length"
        assert len(choice["logprobs"]["tokens"]) == len(ids) and choice["logprobs"]["top_logprobs"][1] == {}
        assert body["usage"]["completion_tokens"] == 0
    chunks = _stream(client, prompt=TEXTS[1], echo=True, max_tokens=0)
    assert "".join(c["choices"][0]["text"] for c in chunks) == TEXTS[1]
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": "Hi", "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_a_batch_of_prompts_with_echo_and_logprobs(client, gpt2_kv_buffer_loaded, reference):
    prompts = [gpt2_kv_buffer_loaded.encode(t) for t in TEXTS]
    body = _complete(client, prompt=prompts, echo=True, logprobs=1, max_tokens=1, temperature=0)
    for ids, choice in zip(prompts, body["choices"], strict=True):
        expected = reference_logprobs(reference, ids)
        got = np.array(choice["logprobs"]["token_logprobs"][1:len(ids)])
        assert np.all(np.abs(got - expected[np.arange(len(ids) - 1), ids[1:]]) < TOLERANCE)


def test_every_pool_keeps_each_prompt_positions_logits(gpt2_loaded, gpt2_kv_buffer_loaded, reference):
    """SequentialPool (standard graph), SlotPool and the GPU's DeviceSlotPool (here on the CPU): a chunked
    prefill and a padded group keep (L, V) logits equal to the reference's, for the rows that ask only."""
    from gptedge.runtime import load
    from gptedge.runtime.graphs.cuda_graph import GraphDecoder
    from gptedge.runtime.graphs.device_slot_pool import DeviceSlotPool
    from gptedge.runtime.graphs.kv_buffer_pool import SlotPool
    from gptedge.runtime.graphs.sequence_pool import SequentialPool, drain

    kvb = load(gpt2_kv_buffer_loaded.model_dir, device="cpu")
    context = kvb.manifest.shape.context_length
    pools = [SequentialPool(gpt2_loaded.variant, 4, context), SlotPool(kvb.variant, 4, context),
             DeviceSlotPool(kvb.variant, 4, context, GraphDecoder(kvb.variant, 4, kvb.session))]
    long, short = gpt2_loaded.encode(TEXTS[3]), gpt2_loaded.encode(TEXTS[1])
    want = {len(p): reference_logprobs(reference, p) for p in (long, short)}
    for pool in pools:
        assert pool.keeps_prompt_logits
        last = drain(pool.prefill(1, long, 4, keep_all=True))  # chunks of 4 positions
        pool.prefill_group([2, 3], [short, long], keep_all=[True, False])
        assert set(pool.prompt_logits) == {1, 2}, type(pool).__name__
        for seq, ids in ((1, long), (2, short)):
            kept = pool.prompt_logits.pop(seq)
            assert kept.shape == (len(ids), kvb.manifest.shape.vocab_size) and kept.dtype == np.float32
            logp = kept.astype(np.float64) - np.log(np.exp(kept.astype(np.float64)).sum(-1, keepdims=True))
            assert np.abs(logp - want[len(ids)]).max() < TOLERANCE, type(pool).__name__
            if seq == 1:  # the ordinary return value is the last position's, as without keep_all
                assert np.array_equal(last, kept[-1])
        pool.remove(3)


def test_the_schema_asks_the_engine_for_prompt_logprobs_only_with_echo():
    from gptedge.serve.openai_schema import parse_completion_request

    def parsed(**fields):
        return parse_completion_request({"model": "m", "prompt": "Hi", **fields}, 16)
    assert parsed(echo=True, logprobs=3).prompt_logprobs == 3
    assert parsed(echo=True, logprobs=0, max_tokens=0).prompt_logprobs == 0
    assert parsed(echo=True, max_tokens=0).prompt_logprobs == 0  # the echo alone: the prompt still runs once
    assert parsed(logprobs=3).prompt_logprobs is None and parsed(echo=True).prompt_logprobs is None


def test_a_prompt_scored_after_its_prefix_was_cached_runs_every_position(model, reference):
    """Prefix reuse skips cached positions, whose logits a scored prompt needs: the engine gives such a request no
    cached prefix, so its logprobs equal the reference even when an earlier request cached the whole prompt."""
    ids = model.encode(TEXTS[0] + " and " + TEXTS[3])  # a whole 16-token block and more
    engine = Engine(model, max_batch=4, max_queue=8, prefix_cache_mb=8).start()
    try:
        first, scored = Collector(), Collector()
        engine.submit(CompletionRequest(tuple(ids), 2, GREEDY), first)
        assert first.finished()
        engine.submit(CompletionRequest(tuple(ids), 0, GREEDY, prompt_logprobs=2), scored)
        assert scored.finished() and scored.last.finish_reason == FinishReason.LENGTH
    finally:
        engine.stop(grace_s=1)
    cache = engine.prefix.cache
    assert len(cache) >= 1 and cache.saved_tokens == 0  # the prompt was cached, and nothing was taken from it
    check_against_reference(reference, ids, scored.last.prompt_logprobs, 2)
