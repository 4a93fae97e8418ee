"""Structured output on /v1/completions and /v1/chat/completions: the request fields that constrain the output,
parsed into one ConstraintSpec, and compiled before the request is admitted (docs/serving.md#structured-output).

Fields (one at most per request):
- `response_format`: OpenAI's `{"type": "text"}` (no constraint), `{"type": "json_object"}` (any JSON object) or
  `{"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}`. On /v1/completions it is
  an extension (OpenAI's legacy endpoint has none), taken in the same shape.
- `regex`: the output matches this regular expression (Rust regex syntax, whole output), an extension.
- `grammar`: the output is a sentence of this Lark grammar (llguidance's syntax), an extension.

Compiling runs off the event loop (the caller's run_in_threadpool); a schema feature llguidance cannot enforce or
a bad regex / grammar is a one-line 400 naming the field.
"""

from __future__ import annotations

import re
import threading

from gptedge.runtime.errors import MissingExtraError
from gptedge.runtime.generation.constraints import (Constraint, ConstraintCompiler, ConstraintError,
                                                    ConstraintSpec)

from .openai_schema import ApiError, bad

FIELDS = ("response_format", "regex", "grammar")
SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for json_schema.name
JSON_SCHEMA_KEYS = frozenset({"name", "schema", "strict", "description"})


def requested_constraint(body: dict) -> tuple[str, ConstraintSpec] | None:
    """-> (the field that asked, its ConstraintSpec), or None for unconstrained output; ApiError(400) naming the
    field for a malformed one or for more than one."""
    asked = [name for name in FIELDS if body.get(name) is not None and body.get(name) != {"type": "text"}]
    if len(asked) > 1:
        raise bad(asked[1], f"give at most one of response_format, regex and grammar (got {' and '.join(asked)})")
    if not asked:
        return None
    name = asked[0]
    if body.get("ignore_eos"):
        raise bad("ignore_eos", f"ignore_eos cannot be combined with {name} (a complete output ends the text)")
    value = body[name]
    if name in ("regex", "grammar"):
        if not isinstance(value, str) or not value:
            raise bad(name, f"{name} must be a non-empty string")
        return name, ConstraintSpec(name, value)
    return name, ConstraintSpec.json_schema(_schema(value))


def _schema(response_format) -> dict | bool:
    """response_format -> the JSON schema it asks for."""
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "json_object" and set(response_format) == {"type"}:
        return {"type": "object"}
    if kind != "json_schema":
        raise bad("response_format", 'response_format must be {"type": "text"}, {"type": "json_object"} or '
                                     '{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}')
    spec = response_format.get("json_schema")
    if set(response_format) != {"type", "json_schema"} or not isinstance(spec, dict):
        raise bad("response_format", 'response_format.json_schema must be an object: {"name": ..., "schema": {...}}')
    unknown = sorted(set(spec) - JSON_SCHEMA_KEYS)
    if unknown:
        raise bad("response_format", f"response_format.json_schema has unknown fields: {', '.join(unknown)}")
    if not isinstance(spec.get("name"), str) or not SCHEMA_NAME.fullmatch(spec["name"]):
        raise bad("response_format", "response_format.json_schema.name must be 1-64 letters, digits, _ or -")
    if not isinstance(spec.get("strict", False), (bool, type(None))):
        raise bad("response_format", "response_format.json_schema.strict must be true or false")
    if not isinstance(spec.get("description", ""), (str, type(None))):
        raise bad("response_format", "response_format.json_schema.description must be a string")
    schema = spec.get("schema")
    if not isinstance(schema, (dict, bool)):
        raise bad("response_format", "response_format.json_schema.schema must be a JSON schema (an object)")
    return schema


class Constraints:
    """One served model's compiler, made on the first constrained request (llguidance is imported then)."""

    def __init__(self, model):
        self._model, self._compiler = model, None
        self._lock = threading.Lock()

    def compile(self, asked: tuple[str, ConstraintSpec] | None) -> Constraint | None:
        """The request's constraint compiled (None: none asked), or ApiError(400) naming the field. Blocking:
        call it off the event loop."""
        if asked is None:
            return None
        name, spec = asked
        with self._lock:
            if self._compiler is None:
                m = self._model.manifest
                self._compiler = ConstraintCompiler(self._model.tokenizer, m.shape.vocab_size, m.stop_ids)
        try:
            return self._compiler.compile(spec)
        except ConstraintError as e:
            raise bad(name, str(e)) from None
        except MissingExtraError as e:
            raise ApiError(501, str(e), "server_error", param=name) from None
