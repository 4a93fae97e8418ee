"""OpenAI's legacy completions API as data: parse and check a request body, build responses, chunks and errors.

No HTTP and no model here: app.py feeds in the decoded JSON body and the served model's facts, and sends
out what these functions build. Shapes follow https://platform.openai.com/docs/api-reference/completions
so the official `openai` client works unchanged; `top_k`, `repetition_penalty` and `ignore_eos` are
extensions (the client passes them through `extra_body`), as are the structured output fields `response_format`,
`regex` and `grammar` (parsed by structured.py).
"""

from __future__ import annotations

import math
import os
import random
import time
from dataclasses import dataclass, field

from gptedge.runtime.generation.sampling import SamplingParams

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_LOGPROBS = 20  # top alternatives per token (OpenAI allows 5; vLLM 20)
MAX_STOP = 16  # stop strings per request (OpenAI allows 4)
MAX_CHOICES = 16  # n and best_of: choices generated per prompt (OpenAI allowed best_of up to 20)
MAX_MESSAGE = 500  # characters of an error message: a client's own names (model, fields) may be megabytes

# Every field OpenAI's completions endpoint knows, and our extensions. Anything else is refused, as
# OpenAI does, so a misspelt parameter is an error rather than silently ignored.
KNOWN_FIELDS = frozenset({
    "model", "prompt", "max_tokens", "temperature", "top_p", "stop", "seed", "stream", "stream_options", "n",
    "best_of", "logprobs", "echo", "suffix", "presence_penalty", "frequency_penalty", "logit_bias", "user",
    "top_k", "repetition_penalty", "ignore_eos",
    "response_format", "regex", "grammar",  # structured output (structured.py reads them)
})


class ApiError(Exception):
    """An error answered in OpenAI's JSON shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        message = message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE] + "..."  # names echo the client
        param = param if param is None or len(param) <= MAX_MESSAGE else param[:MAX_MESSAGE] + "..."
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad(param: str | None, message: str) -> ApiError:
    return ApiError(400, message, param=param)


@dataclass(frozen=True)
class CompletionParams:
    model: str
    prompts: tuple[str | tuple[int, ...], ...]  # text, or token ids; one choice (and engine request) each
    max_tokens: int
    sampling: SamplingParams
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage
    logprobs: int | None = None  # None: no logprobs; N >= 0: the chosen token's and the top N alternatives
    echo: bool = False
    ignore_eos: bool = False
    n: int = 1  # choices returned per prompt
    best_of: int = 1  # choices generated per prompt (>= n); the n with the highest cumulative logprob are returned

    @property
    def prompt_logprobs(self) -> int | None:
        """The engine's prompt_logprobs: echo with logprobs scores the prompt (N alternatives), and max_tokens 0
        (echo only) runs the prompt for nothing else; None: not computed."""
        if self.echo and self.logprobs is not None:
            return self.logprobs
        return 0 if self.max_tokens == 0 else None


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _get(body: dict, name: str, default, check, what: str):
    """body[name] (None: the default) when check(value), else a 400 naming the parameter."""
    v = body.get(name)
    if v is None:
        return default
    if not check(v):
        raise bad(name, f"{name} must be {what}, got {v!r}"[:300])
    return v


def _prompts(v) -> tuple[str | tuple[int, ...], ...]:
    """OpenAI's four prompt forms: a string, a list of strings, a list of ids, a list of lists of ids."""
    if isinstance(v, str):
        return (v,)
    if isinstance(v, list) and v:
        if all(isinstance(p, str) for p in v):
            return tuple(v)
        if all(_is_int(i) for i in v):
            return (tuple(v),)
        if all(isinstance(p, list) and p and all(_is_int(i) for i in p) for p in v):
            return tuple(tuple(p) for p in v)
    raise bad("prompt", "prompt must be a string, a list of strings, a list of token ids or a list of lists of "
                        "token ids (none empty)")


def _stop(v) -> tuple[str, ...]:
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOP:
        raise bad("stop", f"stop must be a non-empty string or a list of at most {MAX_STOP} of them")
    return tuple(stops)


def check_body_fields(body, known: frozenset[str]) -> None:
    """A request body is a JSON object holding only the route's fields (OpenAI's wording), or ApiError(400)."""
    if not isinstance(body, dict):
        raise bad(None, "the request body must be a JSON object")
    unknown = sorted(set(body) - known)
    if unknown:
        raise bad(unknown[0], f"unrecognized request argument supplied: {', '.join(unknown)}")


def sampling_fields(body: dict) -> SamplingParams:
    """temperature, top_p, seed and the extensions top_k / repetition_penalty, as completions and chat take them."""
    temperature = _get(body, "temperature", 1.0, lambda v: _is_number(v) and v >= 0, "a number >= 0")
    top_p = _get(body, "top_p", 1.0, lambda v: _is_number(v) and 0 < v <= 1, "a number in (0, 1]")
    top_k = _get(body, "top_k", 0, lambda v: _is_int(v) and v >= 0, "an integer >= 0 (0: off)")
    penalty = _get(body, "repetition_penalty", 1.0, lambda v: _is_number(v) and v > 0, "a number > 0 (1: off)")
    seed = _get(body, "seed", None, lambda v: _is_int(v) and v >= 0, "an integer >= 0")
    return SamplingParams(temperature=float(temperature), top_k=top_k, top_p=float(top_p),
                          repetition_penalty=float(penalty), seed=seed)


def stream_fields(body: dict) -> tuple[bool, bool]:
    """-> (stream, stream_options.include_usage), the options allowed only with stream: true."""
    stream = _get(body, "stream", False, lambda v: isinstance(v, bool), "true or false")
    options = _get(body, "stream_options", {}, lambda v: isinstance(v, dict) and set(v) <= {"include_usage"}
                   and isinstance(v.get("include_usage", False), bool), 'an object like {"include_usage": true}')
    if options and not stream:
        raise bad("stream_options", "stream_options is only allowed with stream: true")
    return stream, bool(options.get("include_usage", False))


def parse_completion_request(body, max_tokens_limit: int) -> CompletionParams:
    """A decoded JSON body -> CompletionParams, or ApiError(400) naming the first bad parameter.

    The model name is checked by the caller (404 for an unknown one); token counts against the context
    once the prompts are tokenized."""
    check_body_fields(body, KNOWN_FIELDS)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model", "model is required (see GET /v1/models)")
    if "prompt" not in body:
        raise bad("prompt", "prompt is required")
    prompts = _prompts(body["prompt"])
    max_tokens = _get(body, "max_tokens", DEFAULT_MAX_TOKENS, lambda v: _is_int(v) and v >= 0, "an integer >= 0")
    if max_tokens > max_tokens_limit:
        raise bad("max_tokens", f"max_tokens is {max_tokens}; this server allows at most {max_tokens_limit}")
    sampling = sampling_fields(body)
    n = _get(body, "n", 1, lambda v: _is_int(v) and 1 <= v <= MAX_CHOICES, f"an integer 1..{MAX_CHOICES}")
    best_of = _get(body, "best_of", n, lambda v: _is_int(v) and n <= v <= MAX_CHOICES,
                   f"an integer n..{MAX_CHOICES} (n is {n})")
    for name in ("presence_penalty", "frequency_penalty"):
        _get(body, name, 0, lambda v: _is_number(v) and v == 0, "0 (not supported; see repetition_penalty)")
    _get(body, "logit_bias", {}, lambda v: v == {}, "empty (not supported)")
    _get(body, "suffix", "", lambda v: v == "", "empty (not supported)")
    _get(body, "user", "", lambda v: isinstance(v, str), "a string")
    stream, include_usage = stream_fields(body)
    logprobs = _get(body, "logprobs", None, lambda v: _is_int(v) and 0 <= v <= MAX_LOGPROBS,
                    f"an integer 0..{MAX_LOGPROBS}")
    echo = _get(body, "echo", False, lambda v: isinstance(v, bool), "true or false")
    if max_tokens == 0 and not echo:
        raise bad("max_tokens", "max_tokens 0 needs echo: true (the prompt alone, scored with logprobs)")
    if stream and best_of > n:
        raise bad("best_of", f"best_of {best_of} > n {n} cannot stream (the best choices are known at the end)")
    return CompletionParams(
        model=model, prompts=prompts, max_tokens=max_tokens,
        sampling=sampling, stop=_stop(body["stop"]) if body.get("stop") is not None else (), stream=stream,
        include_usage=include_usage, logprobs=logprobs, echo=echo,
        ignore_eos=_get(body, "ignore_eos", False, lambda v: isinstance(v, bool), "true or false"),
        n=n, best_of=best_of,
    )


# -- responses ----------------------------------------------------------------------------------------------
@dataclass
class Logprobs:
    """OpenAI's per-choice logprobs block, built token by token."""

    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[dict[str, float]] = field(default_factory=list)
    text_offset: list[int] = field(default_factory=list)

    def add(self, token: str, logprob: float | None, top: dict[str, float], offset: int) -> None:
        self.tokens.append(token)
        self.token_logprobs.append(logprob)
        self.top_logprobs.append(top)
        self.text_offset.append(offset)

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "token_logprobs": self.token_logprobs, "top_logprobs": self.top_logprobs,
                "text_offset": self.text_offset}


_IDS = random.Random(os.urandom(32))  # this process's, seeded once from the OS (ids differ across restarts)


def response_id(kind: str) -> str:
    """An opaque id for a response, `kind` + 32 hex digits drawn from a generator seeded once per process: not a
    uuid4 each (that reads the OS's random source, a system call per request on the event loop, ~10-50 us, more
    while other threads wait for the GIL), and not a counter (which would tell a client how many requests others
    made between two of its own)."""
    return f"{kind}{_IDS.getrandbits(128):032x}"


class Completion:
    """One response's identity: the id, creation time and model every chunk of it repeats."""

    def __init__(self, model: str):
        self.id, self.created, self.model = response_id("cmpl-"), int(time.time()), model

    def _envelope(self, choices: list[dict]) -> dict:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": choices, "system_fingerprint": None}

    def response(self, choices: list[dict], prompt_tokens: int, completion_tokens: int) -> dict:
        return {**self._envelope(choices), "usage": usage(prompt_tokens, completion_tokens)}

    def chunk(self, index: int, text: str, finish_reason: str | None = None,
              logprobs: Logprobs | None = None) -> dict:
        return self._envelope([choice(index, text, finish_reason, logprobs)])

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict:
        return {**self._envelope([]), "usage": usage(prompt_tokens, completion_tokens)}


def choice(index: int, text: str, finish_reason: str | None, logprobs: Logprobs | None) -> dict:
    return {"index": index, "text": text, "logprobs": logprobs.to_dict() if logprobs is not None else None,
            "finish_reason": finish_reason}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def model_card(name: str, created: int) -> dict:
    return {"id": name, "object": "model", "created": created, "owned_by": "gptedge"}
