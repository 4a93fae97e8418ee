"""OpenAI request parsing and response shapes, without HTTP: every check of a completions body is
given a value that must trip it and the edge values that must pass, and every response shape is checked whole
against OpenAI's legacy completions API as the README describes it."""

from __future__ import annotations

import pytest

from gptedge.serve.openai_schema import (DEFAULT_MAX_TOKENS, MAX_CHOICES, MAX_LOGPROBS, MAX_STOP, ApiError,
                                         Completion, CompletionParams, Logprobs, choice, error_body, model_card,
                                         parse_completion_request, usage)

LIMIT = 100


def parse(**fields):
    return parse_completion_request({"model": "m", "prompt": "Hi", **fields}, LIMIT)


BAD = [  # (body fields, the parameter the 400 names, words its message has)
    ({"model": None}, "model", "model is required"), ({"model": ""}, "model", "model is required"),
    ({"model": 3}, "model", "model is required"), ({"prompt": None}, "prompt", "prompt must be"),
    ({"prompt": []}, "prompt", "prompt must be"), ({"prompt": [[]]}, "prompt", None),
    ({"prompt": [1, "a"]}, "prompt", None), ({"prompt": [True, 2]}, "prompt", None),
       ({"prompt": [[1], []]}, "prompt", None),
    ({"prompt": [[1], [True]]}, "prompt", None), ({"prompt": 7}, "prompt", None), ({"prompt": [1.0]}, "prompt", None),
    ({"max_tokens": 0}, "max_tokens", "max_tokens 0 needs echo: true"),
    ({"max_tokens": -1}, "max_tokens", "max_tokens must be an integer >= 0, got -1"),
    ({"max_tokens": LIMIT + 1}, "max_tokens", f"this server allows at most {LIMIT}"),
    ({"max_tokens": 2.0}, "max_tokens", None), ({"max_tokens": True}, "max_tokens", None),
    ({"temperature": -0.01}, "temperature", "temperature must be a number >= 0"),
       ({"temperature": "1"}, "temperature", None),
    ({"temperature": True}, "temperature", None),
    ({"top_p": 0}, "top_p", "top_p must be a number in (0, 1]"),
    ({"top_p": 1.01}, "top_p", None), ({"top_p": -1}, "top_p", None),
    ({"top_k": -1}, "top_k", "top_k must be an integer >= 0 (0: off)"), ({"top_k": 1.5}, "top_k", None),
    ({"repetition_penalty": 0}, "repetition_penalty", "repetition_penalty must be a number > 0 (1: off)"),
    ({"repetition_penalty": -1}, "repetition_penalty", None),
    ({"seed": -1}, "seed", "seed must be an integer >= 0"), ({"seed": 1.5}, "seed", None),
    ({"seed": False}, "seed", None),
    ({"n": MAX_CHOICES + 1}, "n", f"n must be an integer 1..{MAX_CHOICES}"), ({"n": 0}, "n", None),
    ({"n": True}, "n", None), ({"n": 1.0}, "n", None),
    ({"n": 3, "best_of": 2}, "best_of", f"best_of must be an integer n..{MAX_CHOICES} (n is 3)"),
    ({"best_of": MAX_CHOICES + 1}, "best_of", None),
    ({"best_of": 2, "stream": True}, "best_of", "best_of 2 > n 1 cannot stream"),
    ({"presence_penalty": 0.5}, "presence_penalty", "presence_penalty must be 0"),
    ({"frequency_penalty": -1}, "frequency_penalty", None),
    ({"frequency_penalty": "0"}, "frequency_penalty", None),
    ({"logit_bias": {"1": 5}}, "logit_bias", "logit_bias must be empty"),
       ({"suffix": "x"}, "suffix", "suffix must be empty"),
    ({"user": 5}, "user", "user must be a string"),
    ({"stream": 1}, "stream", "stream must be true or false"), ({"stream": "true"}, "stream", None),
    ({"stream_options": {"include_usage": True}}, "stream_options", "stream_options is only allowed with stream: true"),
    ({"stream": True, "stream_options": {"other": True}}, "stream_options", None),
    ({"stream": True, "stream_options": {"include_usage": 1}}, "stream_options", None),
    ({"stream": True, "stream_options": []}, "stream_options", None),
    ({"logprobs": -1}, "logprobs", f"logprobs must be an integer 0..{MAX_LOGPROBS}"),
    ({"logprobs": MAX_LOGPROBS + 1}, "logprobs", None),
    ({"logprobs": True}, "logprobs", None),
    ({"echo": 1}, "echo", "echo must be true or false"),
    ({"stop": ""}, "stop", f"stop must be a non-empty string or a list of at most {MAX_STOP} of them"),
    ({"stop": 3}, "stop", None), ({"stop": ["a", ""]}, "stop", None),
    ({"stop": ["a", 1]}, "stop", None), ({"stop": ["s"] * (MAX_STOP + 1)}, "stop", None),
    ({"ignore_eos": "yes"}, "ignore_eos", "ignore_eos must be true or false"),
    ({"max_token": 5}, "max_token", "unrecognized request argument supplied: max_token"),
    ({"zeta": 1, "alpha": 2}, "alpha", "alpha, zeta"),
]


@pytest.mark.parametrize("fields, param, says", BAD, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD)])
def test_each_bad_field_is_a_400_naming_it(fields, param, says):
    with pytest.raises(ApiError) as e:
        parse(**fields)
    err = e.value
    assert (err.status, err.param, err.type) == (400, param, "invalid_request_error")
    if says:
        assert err.message.startswith(says) or err.message.endswith(says), err.message
    assert err.body() == {"error": {"message": err.message, "type": "invalid_request_error", "param": param,
                                    "code": None}}


def test_a_body_that_is_not_an_object_or_lacks_the_prompt():
    for body in ([], "x", None, 3):
        with pytest.raises(ApiError, match="must be a JSON object"):
            parse_completion_request(body, LIMIT)
    with pytest.raises(ApiError, match="prompt is required") as e:
        parse_completion_request({"model": "m"}, LIMIT)
    assert e.value.param == "prompt"


def test_defaults():
    p = parse()
    assert (p.model, p.prompts, p.max_tokens, p.stop, p.stream, p.include_usage, p.logprobs, p.echo, p.ignore_eos) == \
        ("m", ("Hi",), DEFAULT_MAX_TOKENS, (), False, False, None, False, False)
    s = p.sampling
    assert (s.temperature, s.top_k, s.top_p, s.repetition_penalty, s.seed, s.greedy) == (1.0, 0, 1.0, 1.0, None, False)
    assert DEFAULT_MAX_TOKENS == 16  # OpenAI's default, as the README says
    bare = CompletionParams("m", ("Hi",), 16, s)  # built by hand, as app code may: the same defaults as a parse
    assert bare == p
    nulls = parse(max_tokens=None, temperature=None, top_p=None, stop=None, seed=None, logprobs=None, n=None)
    assert nulls == p  # null is the default, as OpenAI treats it


def test_edge_values_pass_and_are_kept():
    p = parse(max_tokens=LIMIT, temperature=0, top_p=1, top_k=0, repetition_penalty=1e-6, seed=0, n=1, best_of=1,
              presence_penalty=0, frequency_penalty=0.0, logit_bias={}, suffix="", user="u", logprobs=MAX_LOGPROBS,
              stop=["s"] * MAX_STOP, ignore_eos=True)
    assert p.max_tokens == LIMIT and p.logprobs == MAX_LOGPROBS and p.stop == ("s",) * MAX_STOP and p.ignore_eos
    assert (p.sampling.temperature, p.sampling.top_p, p.sampling.seed) == (0.0, 1.0, 0)
    assert isinstance(p.sampling.temperature, float) and isinstance(p.sampling.top_p, float)
    assert parse(logprobs=0).logprobs == 0 and parse(max_tokens=1).max_tokens == 1
    q = parse(top_p=0.5, top_k=7, temperature=0.7, repetition_penalty=1.3, seed=9, echo=True)
    assert (q.sampling.top_p, q.sampling.top_k, q.sampling.temperature, q.sampling.repetition_penalty, q.sampling.seed,
            q.echo) == (0.5, 7, 0.7, 1.3, 9, True)
    assert parse(stop="\n").stop == ("\n",) and parse(stop=["a", "b"]).stop == ("a", "b")
    s = parse(stream=True, stream_options={"include_usage": True})
    assert s.stream and s.include_usage
    assert not parse(stream=True, stream_options={}).include_usage
    assert not parse(stream=True, stream_options={"include_usage": False}).include_usage


def test_the_four_prompt_forms():
    assert parse(prompt="a").prompts == ("a",)
    assert parse(prompt=["a", "b"]).prompts == ("a", "b")
    assert parse(prompt=[1, 2]).prompts == ((1, 2),)
    assert parse(prompt=[[1, 2], [3]]).prompts == ((1, 2), (3,))


def test_response_shapes():
    c = Completion("tiny")
    assert c.id.startswith("cmpl-") and len(c.id) == 5 + 32 and c.id != Completion("tiny").id
    assert isinstance(c.created, int) and c.model == "tiny"
    lp = Logprobs()
    lp.add("Hi", -0.5, {"Hi": -0.5, "Ho": -1.0}, 3)
    lp.add(" there", None, {}, 5)
    assert lp.to_dict() == {"tokens": ["Hi", " there"], "token_logprobs": [-0.5, None],
                            "top_logprobs": [{"Hi": -0.5, "Ho": -1.0}, {}], "text_offset": [3, 5]}
    assert choice(2, "x", "stop", lp) == {"index": 2, "text": "x", "logprobs": lp.to_dict(), "finish_reason": "stop"}
    assert choice(0, "", None, None) == {"index": 0, "text": "", "logprobs": None, "finish_reason": None}
    assert usage(3, 4) == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    envelope = {"id": c.id, "object": "text_completion", "created": c.created, "model": "tiny",
                "system_fingerprint": None}
    assert c.response([choice(0, "x", "length", None)], 3, 4) == {
        **envelope, "choices": [choice(0, "x", "length", None)], "usage": usage(3, 4)}
    assert c.chunk(1, "y") == {**envelope, "choices": [choice(1, "y", None, None)]}
    assert c.chunk(0, "", "stop", lp) == {**envelope, "choices": [choice(0, "", "stop", lp)]}
    assert c.usage_chunk(1, 2) == {**envelope, "choices": [], "usage": usage(1, 2)}
    assert model_card("tiny", 7) == {"id": "tiny", "object": "model", "created": 7, "owned_by": "gptedge"}
    assert error_body("m") == {"error": {"message": "m", "type": "invalid_request_error", "param": None, "code": None}}
    e = ApiError(429, "busy", "rate_limit_error", code="queue_full", headers={"Retry-After": "1"})
    assert (e.status, str(e), e.headers) == (429, "busy", {"Retry-After": "1"})
    assert e.body() == {"error": {"message": "busy", "type": "rate_limit_error", "param": None, "code": "queue_full"}}
    assert ApiError(400, "x").headers == {}
