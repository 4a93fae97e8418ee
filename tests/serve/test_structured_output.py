"""Structured output (docs/serving.md#structured-output): response_format json_object / json_schema, the regex and
grammar extensions on /v1/completions and /v1/chat/completions (streaming and not), one-line 400s for what cannot
be constrained, the masks themselves (end ids only where the grammar accepts), and a constrained row beside an
unconstrained one in the same batch, the unconstrained one's tokens unchanged. The 50-schema sweep on both
families is tests/serve/test_structured_schemas.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading

import numpy as np
import pytest

pytest.importorskip("llguidance")
pytest.importorskip("starlette")
pytest.importorskip("httpx")
jsonschema = pytest.importorskip("jsonschema")
from starlette.testclient import TestClient  # noqa: E402 - after the skips: the app needs the serve extra

from gptedge.runtime.errors import InvalidArgumentError  # noqa: E402 - after the optional-dependency skip above
from gptedge.runtime.generation.constraints import (ConstraintCompiler, ConstraintError, ConstraintSpec,  # noqa: E402 - after the optional-dependency skip above
                                                    MaskWorker, bounded_numbers)
from gptedge.runtime.generation.sampling import SamplingParams  # noqa: E402 - after the optional-dependency skip above
from gptedge.runtime.serving.engine import CompletionRequest, Engine  # noqa: E402 - after the optional-dependency skip above
from gptedge.serve.app import Generating, ServeState, create_app  # noqa: E402 - after the optional-dependency skip above

NAME = "tiny"
TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 8},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "pet": {"enum": ["cat", "dog", "none"]},
    "scores": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 1}, "minItems": 1, "maxItems": 3},
}, "required": ["name", "age", "pet", "scores"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
GRAMMAR = 'start: "the answer is " ANSWER "."\nANSWER: "yes" | "no" | "maybe"'


@pytest.fixture(scope="module")
def app(gpt2_loaded):
    engine = Engine(gpt2_loaded, max_batch=4, max_queue=16)
    state = ServeState(Generating(engine, gpt2_loaded, max_tokens_limit=128, chat_template=TEMPLATE), NAME)
    engine.start()
    yield TestClient(create_app(state), raise_server_exceptions=False)
    engine.stop(grace_s=1)


@pytest.fixture(scope="module")
def compiler(gpt2_loaded):
    m = gpt2_loaded.manifest
    return ConstraintCompiler(gpt2_loaded.tokenizer, m.shape.vocab_size, m.stop_ids)


def complete(client, path="/v1/completions", **body):
    base = {"model": NAME, "max_tokens": 100, "temperature": 0}
    base.update({"messages": [{"role": "user", "content": "Describe a person."}]} if "chat" in path
                else {"prompt": "A person:"})
    return client.post(path, json={**base, **body})


def stream_text(client, path, **body) -> tuple[str, str]:
    """-> (the streamed text, the last finish_reason) of an SSE response."""
    with client.stream("POST", path, json={"model": NAME, "max_tokens": 100, "temperature": 0, "stream": True,
                                           **body}) as r:
        assert r.status_code == 200, r.read()
        text, finish = "", None
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for c in json.loads(line[6:])["choices"]:
                text += c["delta"].get("content", "") if "delta" in c else c["text"]
                finish = c["finish_reason"] or finish
    return text, finish


def test_json_schema_on_completions_validates_and_streams_the_same(app):
    r = complete(app, response_format=FORMAT)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    jsonschema.validate(json.loads(choice["text"]), PERSON)
    assert choice["finish_reason"] == "stop"
    assert list(json.loads(choice["text"])) == list(PERSON["properties"])  # the schema's key order
    assert stream_text(app, "/v1/completions", prompt="A person:", response_format=FORMAT) == (choice["text"], "stop")


def test_json_object_and_json_schema_on_chat_sampled_and_streamed(app):
    r = complete(app, "/v1/chat/completions", response_format={"type": "json_object"}, max_tokens=120)
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]
    if message["finish_reason"] == "stop":  # a random model may still be inside its object at max_tokens
        assert isinstance(json.loads(message["message"]["content"]), dict)
    else:
        assert message["message"]["content"].startswith("{")
    for seed in (1, 2, 3):
        body = dict(messages=[{"role": "user", "content": "Describe a person."}], response_format=FORMAT,
                    temperature=1.0, seed=seed)
        whole = complete(app, "/v1/chat/completions", **body).json()["choices"][0]
        jsonschema.validate(json.loads(whole["message"]["content"]), PERSON)
        assert stream_text(app, "/v1/chat/completions", **body) == (whole["message"]["content"], "stop")


def test_regex_and_grammar_extensions(app):
    for seed in (0, 1, 2):
        r = complete(app, regex=r"(yes|no), [0-9]{2}!", temperature=1.0, seed=seed).json()["choices"][0]
        assert re.fullmatch(r"(yes|no), [0-9]{2}!", r["text"]) and r["finish_reason"] == "stop", r
        g = complete(app, "/v1/chat/completions", grammar=GRAMMAR, temperature=1.0, seed=seed).json()["choices"][0]
        assert re.fullmatch(r"the answer is (yes|no|maybe)\.", g["message"]["content"]), g
        assert g["finish_reason"] == "stop"


def test_max_tokens_cuts_a_constrained_output_with_length(app):
    r = complete(app, response_format=FORMAT, max_tokens=3).json()["choices"][0]
    assert r["finish_reason"] == "length" and r["text"].startswith('{"name"'[: len(r["text"])])


@pytest.mark.parametrize("body, param, words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}},
     "response_format", "Unimplemented keys"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 2}}}}, "response_format", "Unsatisfiable"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nope"}}}},
     "response_format", "does not exist"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strnig"}}}},
     "response_format", "Invalid type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}},
     "response_format", "name"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format", "schema"),
    ({"response_format": {"type": "yaml"}}, "response_format", "json_object"),
    ({"regex": "(ab"}, "regex", "unclosed group"),
    ({"regex": ""}, "regex", "non-empty"),
    ({"grammar": "start: undefined_rule"}, "grammar", "unknown name"),
    ({"regex": "a+", "grammar": 'start: "a"'}, "grammar", "at most one"),
    ({"response_format": {"type": "json_object"}, "regex": "a"}, "regex", "at most one"),
    ({"response_format": {"type": "json_object"}, "ignore_eos": True}, "ignore_eos", "ignore_eos"),
])
def test_what_cannot_be_constrained_is_a_one_line_400(app, body, param, words):
    for path in ("/v1/completions", "/v1/chat/completions"):
        r = complete(app, path, **body)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == param and words in error["message"] and "\n" not in error["message"], error


def test_text_response_format_is_unconstrained(app):
    plain, text = complete(app, max_tokens=8), complete(app, max_tokens=8, response_format={"type": "text"})
    assert text.status_code == 200 and text.json()["choices"][0]["text"] == plain.json()["choices"][0]["text"]


def _run(engine, requests) -> list:
    """Submit every request before the engine starts (so they are admitted together), start it, wait for all."""
    done, results = threading.Semaphore(0), [None] * len(requests)

    def on_event(i, event):
        if event.finish_reason is not None:
            results[i] = event
            done.release()
    for i, r in enumerate(requests):
        engine.submit(r, lambda e, i=i: on_event(i, e))
    engine.start()
    for _ in requests:
        assert done.acquire(timeout=120)
    engine.stop(grace_s=1)
    return results


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=7)])
def test_a_constrained_and_an_unconstrained_row_share_a_batch(gpt2_loaded, compiler, sampling):
    prompt = tuple(gpt2_loaded.encode_prompt("It was a bright cold day in April"))
    constraint = compiler.compile(ConstraintSpec.json_schema(PERSON))
    free = CompletionRequest(prompt, 40, sampling, ignore_eos=True)
    solo = _run(Engine(gpt2_loaded, max_batch=2), [free])[0]
    engine = Engine(gpt2_loaded, max_batch=2)
    widths, step = [], engine.pool.step
    engine.pool.step = lambda seqs, tokens: widths.append(len(seqs)) or step(seqs, tokens)
    bound, together = _run(engine, [CompletionRequest(prompt, 80, sampling, constraint=constraint), free])
    assert widths and widths[0] == 2  # both rows in the same decode steps
    assert together.generation.ids == solo.generation.ids and together.generation.text == solo.generation.text
    jsonschema.validate(json.loads(bound.generation.text), PERSON)
    assert bound.finish_reason == "stop" and bound.generation.stop == "grammar"


@pytest.mark.parametrize("model_ends", [1, 2])
def test_masks_allow_the_end_ids_only_where_the_grammar_accepts(gpt2_loaded, model_ends):
    """Two end ids: both the model's (a family with several eos ids), or one model eos + a chat end of turn."""
    tokenizer, vocab = gpt2_loaded.tokenizer, gpt2_loaded.manifest.shape.vocab_size
    ends = (tokenizer.token_to_id("<|endoftext|>"), 11)
    compiler = ConstraintCompiler(tokenizer, vocab, ends[:model_ends])
    row = compiler.compile(ConstraintSpec("regex", "[0-9]+")).start(extra_end_ids=ends[model_ends:])
    logits = np.zeros(vocab, dtype=np.float32)
    masked = row.apply(logits)
    assert not row.allowed[list(ends)].any() and np.isneginf(masked[list(ends)]).all()
    digits = [tokenizer.token_to_id(str(d)) for d in range(10)]
    assert row.allowed[digits].all() and not row.allowed[tokenizer.token_to_id("a")]
    assert np.isfinite(masked).sum() == row.allowed.sum()
    assert row.advance(digits[4]) and row.stale and not row.done
    worker = MaskWorker()
    worker.begin([row]).result()  # the next mask, computed on the worker's thread
    assert not row.stale and row.allowed[list(ends)].all() and row.allowed[digits].all()
    assert worker.begin([row]) is None  # nothing stale: no work, no waiting
    worker.close()
    done = ConstraintCompiler(tokenizer, vocab, ends[:1]).compile(ConstraintSpec("regex", "ok")).start()
    assert done.advance(tokenizer.token_to_id("ok")) and done.done


def test_compile_errors_are_one_line_and_compiled_constraints_are_cached(compiler):
    with pytest.raises(ConstraintError, match="unclosed group") as e:
        compiler.compile(ConstraintSpec("regex", "(a"))
    assert "\n" not in str(e.value)
    spec = ConstraintSpec.json_schema(PERSON)
    assert compiler.compile(spec) is compiler.compile(ConstraintSpec.json_schema(PERSON))
    with pytest.raises(InvalidArgumentError, match="kind"):
        ConstraintSpec("yaml", "a: 1")


def test_numbers_get_finite_lengths_and_data_is_left_alone():
    schema = {"type": "object", "properties": {
        "n": {"type": "number"}, "i": {"type": ["integer", "null"], "exclusiveMinimum": 0},
        "m": {"type": "number", "multipleOf": 0.5, "maximum": 3}, "e": {"enum": [{"type": "number"}]}}}
    p = bounded_numbers(schema)["properties"]
    assert p["n"] == {"type": "number", "minimum": -(2**53 - 1), "maximum": 2**53 - 1, "multipleOf": 1e-9}
    assert p["i"] == {"type": ["integer", "null"], "exclusiveMinimum": 0, "maximum": 2**53 - 1}
    assert p["m"] == {"type": "number", "multipleOf": 0.5, "maximum": 3, "minimum": -(2**53 - 1)}
    assert p["e"] == {"enum": [{"type": "number"}]} and schema["properties"]["n"] == {"type": "number"}


def test_engine_refuses_a_constraint_it_cannot_honour(gpt2_loaded, compiler):
    constraint = compiler.compile(ConstraintSpec("regex", "[a-z]+"))
    with pytest.raises(InvalidArgumentError, match="ignore_eos"):
        CompletionRequest((1, 2), 4, constraint=constraint, ignore_eos=True)
    with pytest.raises(TypeError, match="Constraint"):
        CompletionRequest((1, 2), 4, constraint="[a-z]+")
    other = ConstraintCompiler(gpt2_loaded.tokenizer, 60000, ()).compile(ConstraintSpec("regex", "[a-z]+"))
    with pytest.raises(InvalidArgumentError, match="60000"):
        Engine(gpt2_loaded, max_batch=1).submit(CompletionRequest((1, 2), 4, constraint=other), lambda e: None)


def test_the_runtime_imports_llguidance_only_for_a_constraint():
    code = ("import sys; import gptedge.runtime.serving.engine, gptedge.serve.app; "
            "assert 'llguidance' not in sys.modules, 'imported eagerly'")
    subprocess.run([sys.executable, "-c", code], check=True)
