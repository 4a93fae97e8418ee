"""The serving engine's continuous batching: every request gets what generate() gives it alone."""

from __future__ import annotations

import time

import pytest

from gptedge.runtime.errors import InvalidArgumentError, PromptTooLongError
from gptedge.runtime.generation.sampling import SamplingParams
from gptedge.runtime.serving.emission import Emission
from gptedge.runtime.serving.engine import CompletionRequest, Engine, FinishReason, QueueFullError

from ..support.engine import Collector, staggered_requests, wait_until


@pytest.mark.slow  # sixteen generations in the engine and alone, both graphs
@pytest.mark.parametrize("graph", ["standard", "kv_buffer"])
def test_sixteen_staggered_requests_get_their_solo_results(gpt2_loaded, gpt2_kv_buffer_loaded, graph):
    model = gpt2_loaded if graph == "standard" else gpt2_kv_buffer_loaded
    requests = staggered_requests(model, 16)
    solo = [model.generate(list(r.prompt_ids), r.max_new_tokens, stop=r.stop, **vars(r.sampling)) for r in requests]
    # 3 rows for 16 requests: queueing, rows reused, windows moved left (context 128) and right (long newcomers)
    engine = Engine(model, max_batch=3, max_queue=16, prefill_chunk=4).start()
    got = []
    for i, r in enumerate(requests):
        got.append(Collector())
        engine.submit(r, got[-1])
        if i % 4 == 3:
            time.sleep(0.05)  # let some join a batch that is already running
    for c in got:
        assert c.finished()
    engine.stop(grace_s=1)
    for r, want, c in zip(requests, solo, got, strict=True):
        result = c.last.generation
        assert "".join(e.text for e in c.events) == result.text  # streamed pieces add up to the text
        assert [e.token_id for e in c.events if e.token_id is not None] == result.ids
        assert c.last.finish_reason == ("length" if result.stop in ("max_new_tokens", "context") else "stop")
        assert c.last.finish_reason is (FinishReason.LENGTH if result.stop in ("max_new_tokens", "context")
                                        else FinishReason.STOP)
        if graph == "kv_buffer" and not r.sampling.is_greedy:
            # batched rows' logits may be ~1e-7 off solo ones (README, serve), later tokens may differ; the first
            # token's prefill (alone, or left-padded in a group) is ~1e-6 off at most: no seeded draw here flips
            assert result.ids[:1] == want.ids[:1]
        else:  # greedy, or the standard graph's pool (each row its own batch-1 state): exactly generate()'s
            assert result.ids == want.ids and result.text == want.text and result.stop == want.stop
    assert engine.metrics.tokens_out == sum(len(c.last.generation.ids) for c in got)


def test_cancel_frees_the_row_and_leaves_others_alone(gpt2_kv_buffer_loaded):
    model = gpt2_kv_buffer_loaded
    engine = Engine(model, max_batch=2).start()
    keep, drop, after = Collector(), Collector(), Collector()
    ids = tuple(model.encode("Hello world"))
    engine.submit(CompletionRequest(ids, 60, SamplingParams(greedy=True), ignore_eos=True), keep)
    handle = engine.submit(CompletionRequest(ids, 100, SamplingParams(greedy=True), ignore_eos=True), drop)
    wait_until(lambda: len(drop.events) >= 3)
    handle.cancel()
    assert drop.finished() and drop.last.finish_reason is FinishReason.CANCELLED
    engine.submit(CompletionRequest(ids, 20, SamplingParams(greedy=True)), after)  # takes the freed row
    assert keep.finished() and after.finished()
    engine.stop()
    want = model.generate(list(ids), 60, greedy=True, ignore_eos=True).ids
    assert keep.last.generation.ids == want
    assert after.last.generation.ids == model.generate(list(ids), 20, greedy=True).ids
    assert len(drop.last.generation.ids) < 100


def test_queue_full_and_shutdown(gpt2_loaded):
    engine = Engine(gpt2_loaded, max_batch=1, max_queue=1)  # not started: nothing leaves the queue
    ids = tuple(gpt2_loaded.encode("Hi"))
    first = Collector()
    engine.submit(CompletionRequest(ids, 5), first)
    with pytest.raises(QueueFullError, match="max-queue 1"):
        engine.submit(CompletionRequest(ids, 5), Collector())
    engine.stop(grace_s=0)  # never started: the queued request is cancelled, not lost
    assert first.finished(0) and first.last.finish_reason is FinishReason.CANCELLED and first.last.generation.ids == []


def test_submit_all_checks_every_request_before_queueing_any(gpt2_loaded):
    """One HTTP request's prompts: the engine is their one validator, and a refusal leaves nothing behind."""
    engine = Engine(gpt2_loaded, max_batch=1, max_queue=2)  # not started: nothing leaves the queue
    ids = tuple(gpt2_loaded.encode("Hi"))
    vocab = gpt2_loaded.manifest.shape.vocab_size
    with pytest.raises(InvalidArgumentError, match=f"token id {vocab} is outside the vocabulary"):
        engine.submit_all([CompletionRequest(ids, 5), CompletionRequest((1, vocab), 5)], [Collector(), Collector()])
    with pytest.raises(PromptTooLongError):
        engine.submit_all([CompletionRequest(ids, 5), CompletionRequest((1,) * 10_000, 5)], [Collector(), Collector()])
    assert engine.busy == 0  # checked first: nothing was queued
    queued = [Collector(), Collector()]
    with pytest.raises(QueueFullError, match="max-queue 2"):
        engine.submit_all([CompletionRequest(ids, 5)] * 3, [*queued, Collector()])
    engine.start()  # the two queued before the refusal were cancelled with it: they end at once, no token made
    assert all(c.finished() and c.last.finish_reason is FinishReason.CANCELLED and c.last.generation.ids == []
               for c in queued)
    wait_until(lambda: engine.busy == 0)
    engine.stop(grace_s=0)


def test_stop_cancels_what_runs_past_the_grace_period(gpt2_loaded):
    engine = Engine(gpt2_loaded, max_batch=1, max_queue=1).start()
    ids = tuple(gpt2_loaded.encode("Hi"))
    running, queued = Collector(), Collector()
    engine.submit(CompletionRequest(ids, 100, SamplingParams(greedy=True), ignore_eos=True), running)
    wait_until(lambda: len(running.events) >= 1)  # running: its first token is out
    engine.submit(CompletionRequest(ids, 5), queued)  # waits for the one row
    engine.stop(grace_s=0)
    for c in (running, queued):
        assert c.finished(0) and c.last.finish_reason is FinishReason.CANCELLED
    assert 1 <= len(running.last.generation.ids) < 100 and queued.last.generation.ids == []


@pytest.mark.parametrize("chunk", [None, 2])
def test_a_join_that_fails_fails_its_group_and_frees_their_rows(gpt2_kv_buffer_loaded, monkeypatch, chunk):
    """A newcomer's first token fails (say its tokenizer raised): it and the rest of its prefill group end with an
    error, their rows are freed, and the engine serves the next request as generate does."""
    model = gpt2_kv_buffer_loaded
    engine = Engine(model, max_batch=4, prefill_chunk=chunk)
    ids = tuple(model.encode("Hello world, and a prompt long enough to take several chunks"))
    real, calls = Emission.next, []

    def failing_once(self, active, logits, tok=None):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the tokenizer failed")
        return real(self, active, logits, tok)

    monkeypatch.setattr(Emission, "next", failing_once)
    group = [Collector() for _ in range(1 if chunk else 3)]
    for c in group:
        engine.submit(CompletionRequest(ids, 8, SamplingParams(greedy=True), ignore_eos=True), c)
    engine.start()  # all queued first: one prefill group (or one long prompt in chunks)
    assert all(c.finished() for c in group)
    assert [c.last.finish_reason for c in group] == [FinishReason.ERROR] * len(group)
    after = Collector()
    engine.submit(CompletionRequest(ids, 8, SamplingParams(greedy=True), ignore_eos=True), after)
    assert after.finished()
    engine.stop()
    assert after.last.generation.ids == model.generate(list(ids), 8, greedy=True, ignore_eos=True).ids
