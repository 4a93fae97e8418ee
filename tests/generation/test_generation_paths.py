"""Generation and the serving engine off the greedy path and at their limits. The oracle is a full
recompute of the prompt + tokens so far through LoadedModel.forward (no cache, no sampling code), with the
filters written out here from their README definitions."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from gptedge.runtime.errors import InvalidArgumentError, PromptTooLongError
from gptedge.runtime.generation.generation import Generation, SequenceState, check_prompts, left_pad, positions
from gptedge.runtime.generation.sampling import SamplingParams
from gptedge.runtime.serving.engine import CompletionRequest, Engine, EngineStoppedError


def next_logits(model, ids) -> np.ndarray:
    """Logits (V,) float64 for the token after `ids`, by a full recompute."""
    x = np.array([ids], dtype=np.int64)
    logits, _ = model.forward(x, np.ones_like(x), np.arange(x.shape[1])[None], model.empty_past(1))
    return logits[0, -1].astype(np.float64)


def test_positions_and_left_padding():
    assert positions(np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert ids.dtype == mask.dtype == np.int64


@pytest.mark.parametrize("prompts, new, error, says", [
    ([[1]], 0, InvalidArgumentError, "max_new_tokens must be an integer >= 1, got 0"),
    ([[1]], 2.0, InvalidArgumentError, "max_new_tokens"), ([], 1, InvalidArgumentError, "no prompt given$"),
    ([[1], []], 1, InvalidArgumentError, "a prompt is empty: give at least one token$"),
    ([list(range(16))], 1, PromptTooLongError,
     "prompt is 16 tokens; the model's context holds 16, leaving no room for a new token$"),
    ([[1, 100]], 1, InvalidArgumentError, "token id 100 is outside the vocabulary \\(0..99\\)$"),
    ([[-1]], 1, InvalidArgumentError, "token id -1 is outside"),
    ([[1, 2.0]], 1, TypeError, "prompt token ids are integers, got float"),  # the one id check (arguments.check_ids)
    ([[1, True]], 1, TypeError, "prompt token ids are integers, got bool"),
])
def test_each_prompt_check_trips(prompts, new, error, says):
    with pytest.raises(error, match="^" + says):
        check_prompts(prompts, new, context_length=16, vocab_size=100)


def test_prompts_at_the_edges_pass():
    check_prompts([list(range(15)), [99], [0]], 1, context_length=16, vocab_size=100)
    check_prompts([[5000]], 1, context_length=16)  # no vocabulary given: ids unchecked


def test_the_first_stop_reason_that_applies_is_reported():
    def state(prompt_len=2):
        return SequenceState(Generation(prompt_ids=[0] * prompt_len), None, np.random.default_rng(0), [])

    s = state()
    assert s.take(7, eos_id=7, max_new_tokens=1, context_length=3) == "" and s.result.stop == "eos"  # eos first
    s = state()
    s.take(5, eos_id=7, max_new_tokens=2, context_length=100)
    assert s.result.stop == "" and s.seen == [5]
    s.take(6, eos_id=7, max_new_tokens=2, context_length=100)
    assert s.result.stop == "max_new_tokens" and s.result.ids == [5, 6]
    s = state(prompt_len=8)
    s.take(5, eos_id=None, max_new_tokens=5, context_length=10)
    assert s.result.stop == ""
    s.take(7, eos_id=None, max_new_tokens=5, context_length=10)
    assert s.result.stop == "context"
    fresh = Generation(prompt_ids=[1]).to_dict()
    assert fresh == {"prompt_ids": [1], "ids": [], "text": None, "stop": "", "time_to_first_token_s": 0.0,
                     "tokens_per_s": 0.0}


def test_greedy_with_a_repetition_penalty_follows_the_penalised_argmax(gpt2_loaded):
    prompt = gpt2_loaded.encode("Hello world")
    got = gpt2_loaded.generate(prompt, 10, greedy=True, repetition_penalty=1.5, ignore_eos=True).ids
    ids = list(prompt)
    for _ in range(10):
        logits = next_logits(gpt2_loaded, ids)
        seen = np.unique(ids)
        logits[seen] = np.where(logits[seen] > 0, logits[seen] / 1.5, logits[seen] * 1.5)
        ids.append(int(np.argmax(logits)))
    assert got == ids[len(prompt):]
    assert got != gpt2_loaded.generate(prompt, 10, greedy=True, ignore_eos=True).ids  # the penalty changed it


@pytest.mark.parametrize("sampling, allowed", [
    (dict(top_k=3, seed=1), lambda logits: set(np.argsort(-logits)[:3].tolist())),
    (dict(top_p=0.3, temperature=0.5, seed=2), "nucleus"),
])
def test_each_sampled_token_is_inside_its_filter(gpt2_loaded, sampling, allowed):
    prompt = gpt2_loaded.encode("It is a truth")
    out = gpt2_loaded.generate(prompt, 16, ignore_eos=True, **sampling)
    ids, off_greedy = list(prompt), 0
    for tok in out.ids:
        logits = next_logits(gpt2_loaded, ids)
        if allowed == "nucleus":  # the smallest set of most likely tokens reaching p, after temperature
            z = logits / sampling["temperature"]
            p = np.exp(z - z.max())
            p /= p.sum()
            order = np.argsort(-p)
            n = int(np.searchsorted(np.cumsum(p[order]), sampling["top_p"]) + 1)
            keep = set(order[:n].tolist())
        else:
            keep = allowed(logits)
        assert tok in keep
        off_greedy += tok != int(np.argmax(logits))
        ids.append(tok)
    assert off_greedy > 0  # really sampled, not greedy
    assert out.ids == gpt2_loaded.generate(prompt, 16, ignore_eos=True, **sampling).ids


def test_timings_are_consistent(gpt2_loaded):
    started = time.perf_counter()
    outs = gpt2_loaded.generate_batch(["Hello", "It is a truth"], 6, greedy=True, ignore_eos=True)
    took = time.perf_counter() - started
    for r in outs:
        assert 0 < r.time_to_first_token_s < took and 0 < r.decode_s < took  # both inside the call
        assert r.tokens_per_s == pytest.approx(sum(len(o.ids) - 1 for o in outs) / r.decode_s)


def test_a_row_that_stops_early_keeps_its_result_while_the_batch_goes_on(gpt2_loaded):
    prompts = [gpt2_loaded.encode("Hello"), gpt2_loaded.encode("It is a truth universally")]
    solo = [gpt2_loaded.generate(p, 12, greedy=True, ignore_eos=True) for p in prompts]
    stop = gpt2_loaded.decode(solo[0].ids[2:4])
    if stop in gpt2_loaded.decode(solo[1].ids):
        pytest.skip("the stop string would end both rows")  # not with this seeded model
    outs = gpt2_loaded.generate_batch(prompts, 12, stop=[stop], greedy=True, ignore_eos=True)
    assert outs[0].stop == "stop_string" and outs[0].text == solo[0].text[:solo[0].text.index(stop)]
    assert outs[1].ids == solo[1].ids and outs[1].stop == "max_new_tokens"


def test_a_row_at_the_context_limit_stops_while_a_shorter_one_goes_on(gpt2_loaded):
    long, short = list(range(100, 220)), gpt2_loaded.encode("Hello world")  # 120 of 128 positions, and 2
    outs = gpt2_loaded.generate_batch([long, short], 20, greedy=True, ignore_eos=True)
    assert outs[0].stop == "context" and len(outs[0].ids) == 8
    assert outs[1].stop == "max_new_tokens" and outs[1].ids == gpt2_loaded.generate(short, 20, greedy=True,
                                                                                       ignore_eos=True).ids


# -- the engine ------------------------------------------------------------------------------------------------
class Events(list):
    def __init__(self):
        super().__init__()
        self.done = threading.Event()

    def __call__(self, event):
        self.append(event)
        if event.finish_reason:
            self.done.set()


def run(engine, *requests):
    got = [Events() for _ in requests]
    for r, g in zip(requests, got, strict=True):
        engine.submit(r, g)
    for g in got:
        assert g.done.wait(60)
    return got


def test_engine_options_are_checked(gpt2_loaded):
    for options, says in ((dict(max_batch=0), "^max_batch must be >= 1, got 0$"),
                          (dict(max_queue=-1), "^max_queue must be >= 0, got -1$")):
        with pytest.raises(InvalidArgumentError, match=says):
            Engine(gpt2_loaded, **options)
    engine = Engine(gpt2_loaded, max_queue=0)
    with pytest.raises(InvalidArgumentError, match="max_new_tokens"):
        engine.submit(CompletionRequest((1,), 0), Events())
    with pytest.raises(PromptTooLongError):
        engine.submit(CompletionRequest(tuple(range(128)), 1), Events())


def test_the_queue_depth_counts_waiting_requests(gpt2_loaded):
    engine = Engine(gpt2_loaded, max_queue=2)  # not started: what is submitted waits
    for n in (1, 2):
        engine.submit(CompletionRequest((1, 2), 1), Events())
        assert engine.metrics.queue_depth == n and engine.busy == n


def test_engine_stops_eos_stop_strings_and_length_like_generate(gpt2_kv_buffer_loaded):
    model = gpt2_kv_buffer_loaded
    prompt = tuple(model.encode("The quick brown fox"))
    solo = model.generate(list(prompt), 12, greedy=True, ignore_eos=True)
    stop = model.decode(solo.ids[4:6])
    engine = Engine(model, max_batch=2).start()
    try:
        greedy = SamplingParams(greedy=True)
        s, n, ctx = run(engine, CompletionRequest(prompt, 12, greedy, stop=(stop,), ignore_eos=True),
                        CompletionRequest(prompt, 12, greedy, ignore_eos=True),
                        CompletionRequest(tuple(range(100, 225)), 10, greedy, ignore_eos=True))
        assert s[-1].finish_reason == "stop" and s[-1].generation.text == solo.text[:solo.text.index(stop)]
        assert "".join(e.text for e in s) == s[-1].generation.text
        assert n[-1].finish_reason == "length" and n[-1].generation.ids == solo.ids
        assert ctx[-1].finish_reason == "length" and len(ctx[-1].generation.ids) == 3  # 125 + 3 = the context
        assert all(e.logprob is None and e.top_logprobs is None for e in n)  # logprobs=0: none asked for
        held = solo.text[-1] + "\x00"  # the last character might start this stop string: held back until the end
        (h,) = run(engine, CompletionRequest(prompt, 12, greedy, stop=(held,), ignore_eos=True))
        assert h[-1].generation.text == solo.text and "".join(e.text for e in h) == solo.text
    finally:
        engine.stop(grace_s=1)
    engine = Engine(model, max_batch=1).start()
    try:
        model_eos = model.manifest.eos_id
        first = model.generate(list(prompt), 1, greedy=True).ids[0]
        model.manifest = model.manifest.replace(eos_id=first)
        (e,) = run(engine, CompletionRequest(prompt, 12, SamplingParams(greedy=True)))
        assert e[-1].finish_reason == "stop" and e[-1].generation.ids == [first] and e[-1].generation.stop == "eos"
    finally:
        model.manifest = model.manifest.replace(eos_id=model_eos)
        engine.stop(grace_s=1)


def test_a_failed_step_fails_what_was_in_flight_and_the_engine_goes_on(gpt2_loaded, monkeypatch):
    engine = Engine(gpt2_loaded, max_batch=2).start()
    try:
        real = engine.pool.step
        calls = []

        def failing(seqs, tokens):
            calls.append(1)
            if len(calls) == 2:
                raise RuntimeError("onnxruntime said no\nsecond line")
            return real(seqs, tokens)

        monkeypatch.setattr(engine.pool, "step", failing)
        ids = tuple(gpt2_loaded.encode("Hello"))
        (e,) = run(engine, CompletionRequest(ids, 8, SamplingParams(greedy=True), ignore_eos=True))
        assert e[-1].finish_reason == "error" and e[-1].error == "RuntimeError: onnxruntime said no"
        (e,) = run(engine, CompletionRequest(ids, 3, SamplingParams(greedy=True), ignore_eos=True))
        assert e[-1].finish_reason == "length" and e[-1].generation.ids == gpt2_loaded.generate(
            list(ids), 3, greedy=True, ignore_eos=True).ids
    finally:
        engine.stop(grace_s=1)


def test_stop_cancels_what_outlasts_the_grace_and_refuses_newcomers(gpt2_loaded):
    engine = Engine(gpt2_loaded, max_batch=1, max_queue=4).start()
    ids = tuple(gpt2_loaded.encode("Hello"))
    running, queued = Events(), Events()
    engine.submit(CompletionRequest(ids, 120, SamplingParams(greedy=True), ignore_eos=True), running)
    engine.submit(CompletionRequest(ids, 120, SamplingParams(greedy=True), ignore_eos=True), queued)
    while len(running) < 2:  # in the running batch by its second token
        threading.Event().wait(0.005)
    assert engine.busy == 2
    engine.stop(grace_s=0)
    assert running[-1].finish_reason == "cancelled" and queued[-1].finish_reason == "cancelled"
    assert len(running[-1].generation.ids) < 120 and queued[-1].generation.ids == []
    assert engine.busy == 0
    with pytest.raises(EngineStoppedError, match="^the server is shutting down$"):
        engine.submit(CompletionRequest(ids, 1), Events())
