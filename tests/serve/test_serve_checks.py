"""The HTTP routes in process (Starlette's TestClient over the real app and engine): the API key is
matched whole, logprobs are those of the token actually sampled, and each refusal the README lists comes with
its status, code and headers. tests/serve/test_serve.py runs the same server as a process through the openai client."""

from __future__ import annotations

import asyncio
import json
import re

import numpy as np
import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")
from starlette.testclient import TestClient  # noqa: E402 - after the optional-dependency skips above

from gptedge.runtime.serving.engine import Engine  # noqa: E402 - after the optional-dependency skips above
from gptedge.serve.app import RETRY_AFTER_S, Generating, ServeState, create_app  # noqa: E402 - after the optional-dependency skips above

from ..support.openai_errors import openai_error  # noqa: E402 - after the optional-dependency skips above

KEY = "secret-key"
NAME = "tiny"


def serving(model, api_key=KEY, **engine_options):
    engine = Engine(model, **{"max_batch": 2, "max_queue": 8, **engine_options})
    state = ServeState(Generating(engine, model, max_tokens_limit=64), NAME, api_key=api_key)
    return state, TestClient(create_app(state), raise_server_exceptions=False)


@pytest.fixture(scope="module")
def app(gpt2_loaded):
    state, client = serving(gpt2_loaded)
    state.served.engine.start()
    yield state, client
    state.served.engine.stop(grace_s=1)


def post(client, body, key=KEY, **kw):
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return client.post("/v1/completions", json=None if "content" in kw else {"model": NAME, **body},
                       headers=headers, **kw)


@pytest.mark.parametrize("header, status", [
    (f"Bearer {KEY}", 200), (f"bearer {KEY}", 200), (f"Bearer  {KEY} ", 200),
    ("Bearer secret", 401), (f"Bearer {KEY[:-1]}", 401), (f"Bearer {KEY}x", 401), (f"Bearer {KEY.upper()}", 401),
    ("Bearer ", 401), ("Bearer", 401), (KEY, 401), (f"Basic {KEY}", 401), (f"Token {KEY}", 401),
    ("Bearer None", 401), (None, 401),
])
def test_the_api_key_is_matched_whole(app, header, status):
    _, client = app
    headers = {"Authorization": header} if header is not None else {}
    for path in ("/v1/models", f"/v1/models/{NAME}"):
        r = client.get(path, headers=headers)
        assert r.status_code == status, (path, header, r.text)
    r = client.post("/v1/completions", json={"model": NAME, "prompt": "Hi", "max_tokens": 1}, headers=headers)
    assert r.status_code == status
    if status == 401:
        assert r.headers["WWW-Authenticate"] == "Bearer"
        assert r.json()["error"] == {"message": "missing or incorrect API key: send 'Authorization: Bearer KEY'",
                                     "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}


def test_health_and_metrics_need_no_key_and_a_server_without_one_is_open(app, gpt2_loaded):
    _, client = app
    assert client.get("/health").json() == {"status": "ok", "model": NAME}
    assert client.get("/metrics").status_code == 200
    state, open_client = serving(gpt2_loaded, api_key=None)
    r = open_client.get("/v1/models")
    assert r.json()["data"][0]["id"] == NAME and r.json()["object"] == "list"
    assert open_client.get(f"/v1/models/{NAME}").json()["id"] == NAME


def model_logprobs(model, prompt_ids, generated) -> np.ndarray:
    """The oracle: log-softmax (float64) of a full recompute's logits at each generated position. (N, V)"""
    ids = np.array([list(prompt_ids) + list(generated)], dtype=np.int64)
    T = ids.shape[1]
    logits, _ = model.forward(ids, np.ones_like(ids), np.arange(T)[None], model.empty_past(1))
    rows = logits[0, len(prompt_ids) - 1:T - 1].astype(np.float64)
    rows = rows - rows.max(axis=-1, keepdims=True)
    return rows - np.log(np.exp(rows).sum(axis=-1, keepdims=True))


@pytest.mark.parametrize("sampling", [dict(temperature=1.0, seed=5), dict(temperature=0.6, top_k=8, top_p=0.9, seed=2),
                                      dict(temperature=1.3, repetition_penalty=1.5, seed=11)])
def test_logprobs_are_those_of_the_sampled_token(app, gpt2_loaded, sampling):
    """Reported logprobs are the model's own distribution (before temperature and filters), at the token drawn."""
    _, client = app
    prompt = gpt2_loaded.encode("Hello world")
    body = {"prompt": prompt, "max_tokens": 8, "logprobs": 3, "ignore_eos": True, **sampling}
    got = post(client, body).json()["choices"][0]
    lp = got["logprobs"]
    generated = gpt2_loaded.generate(prompt, 8, ignore_eos=True, **sampling).ids  # the same seed: the same draws
    assert [gpt2_loaded.decode([i]) for i in generated] == lp["tokens"]
    want = model_logprobs(gpt2_loaded, prompt, generated)
    np.testing.assert_allclose(lp["token_logprobs"], want[np.arange(len(generated)), generated], atol=1e-4)
    # off the greedy path: some draw not the best
    assert any(int(np.argmax(w)) != t for w, t in zip(want, generated, strict=True))
    for row, top in zip(want, lp["top_logprobs"], strict=True):
        best = np.argsort(-row)[:3]
        assert list(top) == [gpt2_loaded.decode([int(i)]) for i in best]  # best first
        np.testing.assert_allclose(list(top.values()), row[best], atol=1e-4)
    # where each token's text starts in the completion (a token ending inside a character starts where it does)
    assert lp["text_offset"] == [len(gpt2_loaded.decode(generated[:i]).rstrip("\ufffd")) for i in range(8)]


def test_logprobs_zero_reports_the_token_and_no_alternatives(app, gpt2_loaded):
    _, client = app
    prompt = gpt2_loaded.encode("It is")
    lp = post(client, {"prompt": prompt, "max_tokens": 3, "logprobs": 0, "temperature": 0, "ignore_eos": True}
              ).json()["choices"][0]["logprobs"]
    generated = gpt2_loaded.generate(prompt, 3, greedy=True, ignore_eos=True).ids
    want = model_logprobs(gpt2_loaded, prompt, generated)
    np.testing.assert_allclose(lp["token_logprobs"], want.max(axis=-1), atol=1e-4)
    assert lp["top_logprobs"] == [{}, {}, {}]


@pytest.mark.parametrize("inline_chars, expected", [(None, ["encode", "decode"]), (3, [None, None])])
def test_a_long_prompt_is_encoded_and_echoed_off_the_event_loop_a_short_one_on_it(app, gpt2_loaded, monkeypatch,
                                                                                  inline_chars, expected):
    """Tokenizer work (encode, and the echo's decode) on long text runs in a worker thread, never on the event loop,
    where it would stall every other stream; on short text it runs on the loop, which costs the loop less than the
    hop to a worker (gptedge/serve/off_loop.py)."""
    from gptedge.serve import off_loop

    _, client = app
    on_loop = []

    def recording(method):
        def call(*args, **kw):
            try:
                asyncio.get_running_loop()
                on_loop.append(method.__name__)
            except RuntimeError:  # no loop runs in this thread: a worker
                on_loop.append(None)
            return method(*args, **kw)
        return call

    for name in ("encode", "decode"):
        monkeypatch.setattr(gpt2_loaded, name, recording(getattr(gpt2_loaded, name)))
    if inline_chars is not None:  # "The quick brown fox" (19 characters, 4 tokens) is long then
        monkeypatch.setattr(off_loop, "INLINE_TEXT_CHARS", inline_chars)
    body = {"prompt": "The quick brown fox", "max_tokens": 2, "temperature": 0, "echo": True}
    assert post(client, body).json()["choices"][0]["text"].startswith("The quick brown fox")
    assert on_loop == expected  # one encode, one decode


def test_stop_strings_finish_reasons_usage_and_echo(app, gpt2_loaded):
    _, client = app
    solo = gpt2_loaded.generate("The quick brown fox", 24, greedy=True, ignore_eos=True)
    stop = solo.text[len(solo.text) // 2:][:3]  # a piece of the greedy text from its middle
    assert stop and stop in solo.text
    base = {"prompt": "The quick brown fox", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    got = post(client, {**base, "stop": [stop]}).json()
    assert got["choices"][0]["text"] == solo.text[:solo.text.index(stop)]
    assert got["choices"][0]["finish_reason"] == "stop"
    whole = post(client, base).json()
    assert whole["choices"][0] == {"index": 0, "text": solo.text, "logprobs": None, "finish_reason": "length"}
    assert whole["usage"] == {"prompt_tokens": len(solo.prompt_ids), "completion_tokens": 24,
                              "total_tokens": len(solo.prompt_ids) + 24}
    echoed = post(client, {**base, "echo": True, "max_tokens": 5}).json()["choices"][0]["text"]
    assert echoed == "The quick brown fox" + gpt2_loaded.generate("The quick brown fox", 5, greedy=True,
                                                                 ignore_eos=True).text
    two = post(client, {**base, "prompt": ["A", "The quick brown fox"], "max_tokens": 4}).json()["choices"]
    assert [c["index"] for c in two] == [0, 1]
    assert [c["text"] for c in two] == [gpt2_loaded.generate(p, 4, greedy=True, ignore_eos=True).text
                                        for p in ("A", "The quick brown fox")]


def sse(client, body) -> list:
    with client.stream("POST", "/v1/completions", json={"model": NAME, **body},
                       headers={"Authorization": f"Bearer {KEY}"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["cache-control"] == "no-cache"
        data = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def test_a_stream_carries_the_same_text_then_usage_then_done(app, gpt2_loaded):
    _, client = app
    body = {"prompt": "Hello", "max_tokens": 6, "temperature": 0, "ignore_eos": True, "stream": True}
    chunks = sse(client, {**body, "stream_options": {"include_usage": True}, "echo": True})
    want = gpt2_loaded.generate("Hello", 6, greedy=True, ignore_eos=True)
    pieces = [c["choices"][0] for c in chunks if c["choices"]]
    assert pieces[0]["text"] == "Hello"  # the echo comes first
    assert "".join(p["text"] for p in pieces) == "Hello" + want.text
    assert [p["finish_reason"] for p in pieces] == [None] * (len(pieces) - 1) + ["length"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
    assert len({c["id"] for c in chunks}) == 1 and {c["object"] for c in chunks} == {"text_completion"}
    plain = sse(client, body)
    assert all(c["choices"] for c in plain)  # no usage chunk unless asked
    lp = sse(client, {**body, "logprobs": 1})
    assert all(c["choices"][0]["logprobs"] is not None for c in lp)


def test_refusals_have_their_status_and_code(app, gpt2_loaded):
    state, client = app
    e = openai_error(post(client, {"prompt": "Hi"} | {"model": "gpt-4"}), 404)
    assert (e["code"], e["param"]) == ("model_not_found", "model")
    assert e["message"] == "the model 'gpt-4' does not exist; this server serves 'tiny'"
    assert openai_error(client.get("/v1/models/other", headers={"Authorization": f"Bearer {KEY}"}), 404)["code"] == \
        "model_not_found"
    assert openai_error(post(client, None, content=b"{nope"),
                        400)["message"].startswith("the request body is not valid JSON")
    assert openai_error(post(client, None, content=b"\xff\xfe"),
                        400)["message"].startswith("the request body is not valid JSON")
    long = gpt2_loaded.encode("one two three four " * 60)[:128]
    e = openai_error(post(client, {"prompt": long}), 400)
    assert (e["code"], e["param"]) == ("context_length_exceeded",
                                       "prompt") and e["message"].endswith("; shorten the prompt")
    e = openai_error(post(client, {"prompt": [50257]}), 400)
    assert e["param"] == "prompt" and e["message"] == "token id 50257 is outside the vocabulary (0..50256)"
    assert openai_error(post(client, {"prompt": ""}), 400)["message"] == "a prompt is empty: give at least one token"
    assert openai_error(post(client, {"prompt": "Hi", "max_tokens": 65}), 400)["param"] == "max_tokens"
    assert openai_error(client.get("/nowhere"), 404)["type"] == "invalid_request_error"
    assert openai_error(client.get("/v1/completions"), 405)
    metrics = client.get("/metrics").text
    assert re.search(r'gptedge_http_requests_total\{path="/v1/models/\{model\}",status="404"\} [1-9]', metrics)
    assert re.search(r'gptedge_http_requests_total\{path="other",status="404"\} [1-9]', metrics)
    assert re.search(r'gptedge_http_requests_total\{path="/v1/completions",status="400"\} [1-9]', metrics)


def test_a_prompt_that_fills_the_context_but_one_is_served(app, gpt2_loaded):
    _, client = app
    prompt = gpt2_loaded.encode("one two three four " * 60)[:127]
    got = post(client, {"prompt": prompt, "max_tokens": 5, "temperature": 0, "ignore_eos": True}).json()
    assert got["choices"][0]["finish_reason"] == "length" and got["usage"]["completion_tokens"] == 1


def test_busy_stopping_and_stopped_servers(gpt2_loaded):
    state, client = serving(gpt2_loaded, max_queue=0)  # never started: every request finds the queue full
    r = post(client, {"prompt": "Hi"})
    e = openai_error(r, 429)
    assert (e["code"], e["type"]) == ("queue_full",
                                      "rate_limit_error") and r.headers["Retry-After"] == str(RETRY_AFTER_S)
    assert e["message"] == "the server is busy (0 requests are waiting (--max-queue 0)); retry shortly"
    state.stopping = True
    assert client.get("/health").status_code == 503 and client.get("/health").json() == {"status": "shutting down"}
    e = openai_error(post(client, {"prompt": "Hi"}), 503)
    assert (e["code"], e["message"]) == ("shutting_down", "the server is shutting down")
    state, client = serving(gpt2_loaded)
    state.served.engine.start().stop(grace_s=0)
    e = openai_error(post(client, {"prompt": "Hi"}), 503)
    assert (e["code"], e["type"], e["message"]) == ("shutting_down", "server_error", "the server is shutting down")
