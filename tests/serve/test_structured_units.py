"""The structured-output fields of a request (gptedge/serve/structured.py) parsed without a server: which field asked,
the spec it makes, and each malformed shape's one-line 400 naming its field; the per-model compiler made once,
its errors as 400 / 501. llguidance is never imported here (a stand-in compiler); test_structured_output.py runs the
real one through the app."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import pytest

from gptedge.runtime.errors import MissingExtraError
from gptedge.runtime.generation.constraints import ConstraintError, ConstraintSpec
from gptedge.serve import structured
from gptedge.serve.openai_schema import ApiError
from gptedge.serve.structured import Constraints, requested_constraint

SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}}


def refused(body: dict) -> ApiError:
    with pytest.raises(ApiError) as caught:
        requested_constraint(body)
    assert caught.value.status == 400 and "\n" not in caught.value.message
    return caught.value


def json_schema(**spec) -> dict:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "out", "schema": SCHEMA, **spec}}}


def test_no_field_and_text_format_are_unconstrained():
    assert requested_constraint({}) is None
    assert requested_constraint({"response_format": None, "regex": None, "grammar": None}) is None
    assert requested_constraint({"response_format": {"type": "text"}}) is None
    assert requested_constraint({"response_format": {"type": "text"}, "ignore_eos": True}) is None


def test_regex_and_grammar_make_their_specs():
    assert requested_constraint({"regex": "[ab]+"}) == ("regex", ConstraintSpec("regex", "[ab]+"))
    assert requested_constraint({"grammar": "start: 'x'"}) == ("grammar", ConstraintSpec("grammar", "start: 'x'"))
    assert requested_constraint({"regex": "a", "ignore_eos": False}) == ("regex", ConstraintSpec("regex", "a"))


@pytest.mark.parametrize("name", ["regex", "grammar"])
@pytest.mark.parametrize("value", ["", 5, ["a"], True])
def test_regex_and_grammar_must_be_non_empty_strings(name, value):
    e = refused({name: value})
    assert (e.param, e.message) == (name, f"{name} must be a non-empty string")


def test_json_object_and_json_schema_make_a_schema_spec():
    assert requested_constraint({"response_format": {"type": "json_object"}}) == (
        "response_format", ConstraintSpec.json_schema({"type": "object"}))
    name, spec = requested_constraint(json_schema())
    assert name == "response_format" and spec.kind == "json_schema"
    assert json.loads(spec.source)["properties"] == SCHEMA["properties"]
    assert requested_constraint(json_schema(schema=True))[1] == ConstraintSpec.json_schema(True)
    full = json_schema(strict=True, description="one object")
    assert requested_constraint(full) == requested_constraint(json_schema())
    assert requested_constraint(json_schema(strict=None, description=None)) == requested_constraint(json_schema())


def test_more_than_one_field_names_the_second():
    e = refused({"regex": "a", "grammar": "start: 'a'"})
    assert e.param == "grammar"
    assert e.message == "give at most one of response_format, regex and grammar (got regex and grammar)"
    e = refused({"response_format": {"type": "json_object"}, "regex": "a", "grammar": "g"})
    assert e.param == "regex" and e.message.endswith("(got response_format and regex and grammar)")


def test_ignore_eos_with_a_constraint():
    e = refused({"regex": "a", "ignore_eos": True})
    assert (e.param, e.message) == ("ignore_eos", "ignore_eos cannot be combined with regex (a complete output ends "
                                                   "the text)")


FORMAT_LINE = ('response_format must be {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", '
               '"json_schema": {"name": ..., "schema": {...}}}')
SPEC_LINE = 'response_format.json_schema must be an object: {"name": ..., "schema": {...}}'


@pytest.mark.parametrize("response_format, line", [
    ("json", FORMAT_LINE),
    ({"type": "xml"}, FORMAT_LINE),
    ({}, FORMAT_LINE),
    ({"type": "json_object", "schema": {}}, FORMAT_LINE),
    ({"type": "json_schema"}, SPEC_LINE),
    ({"type": "json_schema", "json_schema": "x"}, SPEC_LINE),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": {}}, "extra": 1}, SPEC_LINE),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": {}, "zeta": 1, "alpha": 2}},
     "response_format.json_schema has unknown fields: alpha, zeta"),
])
def test_malformed_response_formats(response_format, line):
    e = refused({"response_format": response_format})
    assert (e.param, e.message) == ("response_format", line)


NAME_LINE = "response_format.json_schema.name must be 1-64 letters, digits, _ or -"


@pytest.mark.parametrize("name, ok", [("a", True), ("A-z_09", True), ("x" * 64, True), ("x" * 65, False), ("", False),
                                      ("a b", False), ("é", False), (None, False), (3, False), ("a\n", False)])
def test_the_schema_name_rule_on_both_sides_of_its_length(name, ok):
    body = json_schema(name=name)
    if ok:
        assert requested_constraint(body)[0] == "response_format"
    else:
        assert (refused(body).param, refused(body).message) == ("response_format", NAME_LINE)


@pytest.mark.parametrize("spec, line", [
    ({"strict": "yes"}, "response_format.json_schema.strict must be true or false"),
    ({"strict": 1}, "response_format.json_schema.strict must be true or false"),
    ({"description": 5}, "response_format.json_schema.description must be a string"),
    ({"schema": "object"}, "response_format.json_schema.schema must be a JSON schema (an object)"),
    ({"schema": None}, "response_format.json_schema.schema must be a JSON schema (an object)"),
    ({"schema": [1]}, "response_format.json_schema.schema must be a JSON schema (an object)"),
])
def test_malformed_json_schema_fields(spec, line):
    e = refused(json_schema(**spec))
    assert (e.param, e.message) == ("response_format", line)


def test_a_missing_schema_is_refused():
    body = {"response_format": {"type": "json_schema", "json_schema": {"name": "out"}}}
    e = refused(body)
    assert (e.param, e.message) == ("response_format", "response_format.json_schema.schema must be a JSON schema "
                                                       "(an object)")


class Compiler:
    """A stand-in for ConstraintCompiler: records how it was made and what it compiled."""

    made: list = []

    def __init__(self, tokenizer, vocab_size, stop_ids):
        Compiler.made.append((tokenizer, vocab_size, stop_ids))
        self.fail = None

    def compile(self, spec):
        if isinstance(spec.source, str) and spec.source.startswith("bad"):
            raise ConstraintError("regex parse error: unclosed group")
        if spec.source == "extra":
            raise MissingExtraError("structured output needs llguidance: pip install 'gptedge[serve]'")
        return ("compiled", spec)


@pytest.fixture()
def constraints(monkeypatch):
    Compiler.made = []
    monkeypatch.setattr(structured, "ConstraintCompiler", Compiler)
    model = SimpleNamespace(tokenizer="tok", manifest=SimpleNamespace(shape=SimpleNamespace(vocab_size=100),
                                                                       stop_ids=(99,)))
    return Constraints(model)


def test_nothing_asked_compiles_nothing_and_makes_no_compiler(constraints):
    assert constraints.compile(None) is None
    assert Compiler.made == []


def test_the_compiler_is_made_once_for_the_model(constraints):
    spec = ConstraintSpec("regex", "a+")
    assert constraints.compile(("regex", spec)) == ("compiled", spec)
    assert constraints.compile(("regex", spec)) == ("compiled", spec)
    assert Compiler.made == [("tok", 100, (99,))]


def test_the_compiler_is_made_once_under_concurrent_requests(constraints):
    spec = ConstraintSpec("regex", "a+")
    threads = [threading.Thread(target=constraints.compile, args=(("regex", spec),)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(Compiler.made) == 1


def test_compile_errors_are_a_400_naming_the_field_and_a_missing_extra_a_501(constraints):
    with pytest.raises(ApiError) as caught:
        constraints.compile(("grammar", ConstraintSpec("grammar", "bad(")))
    e = caught.value
    assert (e.status, e.param, e.message, e.type) == (400, "grammar", "regex parse error: unclosed group",
                                                      "invalid_request_error")
    with pytest.raises(ApiError) as caught:
        constraints.compile(("regex", ConstraintSpec("regex", "extra")))
    e = caught.value
    assert (e.status, e.param, e.type) == (501, "regex", "server_error")
    assert e.message == "structured output needs llguidance: pip install 'gptedge[serve]'"
