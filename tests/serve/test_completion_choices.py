"""`n` and `best_of` on /v1/completions: choice j of a prompt samples with seed + j, indexes run prompt-major,
best_of keeps the n with the highest cumulative logprob, usage counts every generated token."""

from __future__ import annotations

import json

import numpy as np

import pytest

from gptedge.runtime.generation.sampling import SamplingParams
from gptedge.runtime.serving.engine import Engine, TokenEvent
from gptedge.serve.completion_choices import ChoiceState, choice_sampling, returned
from gptedge.serve.openai_schema import parse_completion_request

PROMPT = "It is a truth universally acknowledged"


@pytest.fixture(scope="module")
def client(gpt2_kv_buffer_loaded):
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from gptedge.serve.app import ServeState, create_app
    from gptedge.serve.routes import Generating

    engine = Engine(gpt2_kv_buffer_loaded, max_batch=4, max_queue=32, prefill_chunk=64).start()
    with TestClient(create_app(ServeState(Generating(engine, gpt2_kv_buffer_loaded, 64), "tiny")),
                    raise_server_exceptions=False) as c:
        yield c
    engine.stop(grace_s=1)


def _complete(client, **body) -> dict:
    r = client.post("/v1/completions", json={"model": "tiny", "max_tokens": 6, "ignore_eos": True, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_n_choices_sample_with_seed_plus_j(client, gpt2_kv_buffer_loaded):
    body = _complete(client, prompt=PROMPT, n=3, seed=7, temperature=1.0)
    texts = [c["text"] for c in body["choices"]]
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    for j, text in enumerate(texts):  # choice j is what one choice with seed 7 + j gives
        assert _complete(client, prompt=PROMPT, seed=7 + j, temperature=1.0)["choices"][0]["text"] == text
    assert len(set(texts)) > 1  # a 50257-token vocabulary at temperature 1: three equal samples would be a bug
    usage = body["usage"]
    assert usage["completion_tokens"] == 18 and usage["prompt_tokens"] == len(gpt2_kv_buffer_loaded.encode(PROMPT))


def test_best_of_returns_the_highest_cumulative_logprob(client):
    body = _complete(client, prompt=PROMPT, n=1, best_of=3, seed=11, temperature=1.0)
    candidates = [_complete(client, prompt=PROMPT, seed=11 + j, temperature=1.0, logprobs=0)["choices"][0]
                  for j in range(3)]
    scores = [sum(c["logprobs"]["token_logprobs"]) for c in candidates]
    best = candidates[max(range(3), key=lambda j: scores[j])]
    assert body["choices"] == [{**best, "logprobs": None}]
    assert body["usage"]["completion_tokens"] == 18  # the two discarded choices are generated, and counted


def test_several_prompts_with_n_are_indexed_prompt_major(client, gpt2_kv_buffer_loaded):
    prompts = [PROMPT, "Hello world"]
    body = _complete(client, prompt=prompts, n=2, temperature=0, echo=True)
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert [c["text"].startswith(prompts[i // 2]) for i, c in enumerate(body["choices"])] == [True] * 4
    assert body["usage"]["prompt_tokens"] == sum(len(gpt2_kv_buffer_loaded.encode(p)) for p in prompts)


def test_n_streams_each_choice_under_its_index(client):
    with client.stream("POST", "/v1/completions", json={"model": "tiny", "prompt": PROMPT, "n": 2, "seed": 3,
                                                        "max_tokens": 4, "ignore_eos": True, "stream": True}) as r:
        assert r.status_code == 200
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    streamed = ["".join(c["choices"][0]["text"] for c in chunks if c["choices"][0]["index"] == j) for j in (0, 1)]
    whole = _complete(client, prompt=PROMPT, n=2, seed=3, max_tokens=4)
    assert streamed == [c["text"] for c in whole["choices"]]


@pytest.mark.parametrize("body, param", [({"n": 0}, "n"), ({"n": 2, "best_of": 1}, "best_of"),
                                         ({"best_of": 2, "stream": True}, "best_of"), ({"n": 17}, "n")])
def test_bounds_are_one_line_400s(client, body, param):
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": PROMPT, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param and "\n" not in r.json()["error"]["message"]


def test_returned_keeps_the_n_best_of_each_prompt_in_order():
    params = parse_completion_request({"model": "m", "prompt": ["a", "b"], "n": 2, "best_of": 3}, 16)
    states = [ChoiceState("", None) for _ in range(6)]
    for state, score in zip(states, [-5.0, -1.0, -3.0, -2.0, -2.0, -9.0], strict=True):
        state.take(TokenEvent("x", 1, score), str, None)
    assert returned(params, states) == [states[1], states[2], states[3], states[4]]  # ties keep their order
    assert [s.seed for s in choice_sampling(params)] == [None] * 3
    seeded = parse_completion_request({"model": "m", "prompt": "a", "best_of": 3, "seed": 5}, 16)
    assert choice_sampling(seeded) == [SamplingParams(seed=s) for s in (5, 6, 7)]


# -- chat's n ----------------------------------------------------------------------------------------------------
TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
MESSAGES = [{"role": "user", "content": "Say something about Bath."}]


@pytest.fixture(scope="module")
def chat_client(gpt2_kv_buffer_loaded):
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from gptedge.serve.app import ServeState, create_app
    from gptedge.serve.routes import Generating

    engine = Engine(gpt2_kv_buffer_loaded, max_batch=4, max_queue=32, prefill_chunk=64).start()
    state = ServeState(Generating(engine, gpt2_kv_buffer_loaded, 64, chat_template=TEMPLATE), "tiny")
    with TestClient(create_app(state), raise_server_exceptions=False) as c:
        yield c
    engine.stop(grace_s=1)


def _chat(client, **body) -> dict:
    r = client.post("/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "max_tokens": 5,
                                                  "ignore_eos": True, "temperature": 1.0, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_chat_n_choices_sample_with_seed_plus_j(chat_client):
    body = _chat(chat_client, n=3, seed=21, logprobs=True)
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    for j, c in enumerate(body["choices"]):
        alone = _chat(chat_client, seed=21 + j, logprobs=True)["choices"][0]
        assert c["message"] == alone["message"] and c["logprobs"] == alone["logprobs"]
    assert len({c["message"]["content"] for c in body["choices"]}) > 1
    assert body["usage"]["completion_tokens"] == 15
    with chat_client.stream("POST", "/v1/chat/completions", json={
            "model": "tiny", "messages": MESSAGES, "max_tokens": 5, "ignore_eos": True, "seed": 21, "n": 3,
            "stream": True}) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    streamed = ["".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"][0]["index"] == j)
                for j in range(3)]
    assert streamed == [c["message"]["content"] for c in body["choices"]]


# -- n copies of one prompt share its prefill run ----------------------------------------------------------------
def test_identical_prompts_of_a_group_run_once_in_the_slot_pool(gpt2_kv_buffer_loaded):
    from gptedge.runtime import load
    from gptedge.runtime.graphs.kv_buffer_pool import SlotPool
    from gptedge.runtime.graphs.sequence_pool import drain

    model = load(gpt2_kv_buffer_loaded.model_dir, device="cpu")
    context = model.manifest.shape.context_length
    p, q = model.encode(PROMPT), model.encode("Hello world")
    shared, alone = SlotPool(model.variant, 4, context), SlotPool(model.variant, 4, context)
    rows = []
    run = shared._run
    shared._run = lambda binding, ids, mask, pos: rows.append(ids.shape[0]) or run(binding, ids, mask, pos)
    first = shared.prefill_group([1, 2, 3], [p, p, q], keep_all=[False, True, True])
    assert rows == [2]  # the two copies of p are one row of the run
    want = np.stack([drain(alone.prefill(s, ids, None)) for s, ids in ((1, p), (2, p), (3, q))])
    assert np.allclose(first, want, atol=1e-5) and set(shared.prompt_logits) == {2, 3}
    for token in (11, 13, 17):  # each copy decodes from its own row: the same token gives the same logits
        got, expect = shared.step([1, 2, 3], np.array([token] * 3)), alone.step([1, 2, 3], np.array([token] * 3))
        assert np.allclose(got, expect, atol=1e-5) and np.array_equal(got[0], got[1])
