"""OpenAI's chat completions API as data: parse and check a request body, build responses and chunks.

Shapes follow https://platform.openai.com/docs/api-reference/chat so the official `openai` client's
`chat.completions.create` works unchanged (streaming or not). The sampling fields, their checks and the
extensions (`top_k`, `repetition_penalty`, `ignore_eos`) are the completions route's (openai_schema.py).
`n` (1..16) gives n choices. `response_format` (and the `regex` / `grammar` extensions) are structured.py's. Not
served yet, each refused in one line naming the field: `tools`, `logit_bias`, penalties other than 0.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from gptedge.runtime.generation.sampling import SamplingParams
from gptedge.runtime.modeldir.chat_template import check_messages
from gptedge.runtime.errors import InvalidArgumentError

from .openai_schema import (DEFAULT_MAX_TOKENS, MAX_CHOICES, MAX_LOGPROBS, _get, _is_int, _is_number, _stop, bad,
                            check_body_fields, response_id, sampling_fields, stream_fields, usage)

ROLES = ("system", "developer", "user", "assistant", "tool", "function")  # the roles OpenAI's chat API takes
CHAT_FIELDS = frozenset({
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "seed", "stream",
    "stream_options", "n", "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty", "logit_bias", "user",
    "response_format", "tools", "tool_choice", "parallel_tool_calls", "store", "metadata",
    "top_k", "repetition_penalty", "ignore_eos", "add_generation_prompt",
    "regex", "grammar",  # structured output extensions; they and response_format are parsed by structured.py
})


@dataclass(frozen=True)
class ChatParams:
    model: str
    messages: tuple[dict, ...]
    max_tokens: int
    sampling: SamplingParams
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    top_logprobs: int | None = None  # None: no logprobs; N: the chosen token's and N alternatives
    ignore_eos: bool = False
    add_generation_prompt: bool = True
    n: int = 1  # choices, each its own engine request (choice j samples with seed + j, as completions' n)


def parse_chat_request(body, max_tokens_limit: int) -> ChatParams:
    """A decoded JSON body -> ChatParams, or ApiError(400) naming the first bad parameter."""
    check_body_fields(body, CHAT_FIELDS)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model", "model is required (see GET /v1/models)")
    try:
        messages = tuple(check_messages(body.get("messages")))
    except InvalidArgumentError as e:
        raise bad("messages", str(e)) from None
    for i, m in enumerate(messages):
        if m["role"] not in ROLES:  # OpenAI's 400; a template would render any role as if the model knew it
            raise bad("messages", f"messages[{i}].role must be one of {', '.join(ROLES)}, got {m['role'][:40]!r}")
        if isinstance(m.get("content"), list):  # text parts only: this server reads no images or audio
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in m["content"]):
                raise bad("messages", f"messages[{i}].content: only text parts are supported")
            m["content"] = "".join(p["text"] for p in m["content"])
    if "max_tokens" in body and "max_completion_tokens" in body:
        raise bad("max_completion_tokens", "give max_tokens or max_completion_tokens, not both")
    name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    max_tokens = _get(body, name, DEFAULT_MAX_TOKENS, lambda v: _is_int(v) and v >= 1, "an integer >= 1")
    if max_tokens > max_tokens_limit:
        raise bad(name, f"{name} is {max_tokens}; this server allows at most {max_tokens_limit}")
    sampling = sampling_fields(body)
    n = _get(body, "n", 1, lambda v: _is_int(v) and 1 <= v <= MAX_CHOICES, f"an integer 1..{MAX_CHOICES}")
    for name in ("presence_penalty", "frequency_penalty"):
        _get(body, name, 0, lambda v: _is_number(v) and v == 0, "0 (not supported; see repetition_penalty)")
    _get(body, "logit_bias", {}, lambda v: v == {}, "empty (not supported)")
    _get(body, "tools", [], lambda v: v == [], "empty (tool calls are not supported)")
    _get(body, "tool_choice", "none", lambda v: v == "none", '"none" (tool calls are not supported)')
    for name in ("user",):
        _get(body, name, "", lambda v: isinstance(v, str), "a string")
    for name in ("parallel_tool_calls", "store"):
        _get(body, name, False, lambda v: isinstance(v, bool), "true or false")
    _get(body, "metadata", {}, lambda v: isinstance(v, dict), "an object")
    stream, include_usage = stream_fields(body)
    logprobs = _get(body, "logprobs", False, lambda v: isinstance(v, bool), "true or false")
    top = _get(body, "top_logprobs", None, lambda v: _is_int(v) and 0 <= v <= MAX_LOGPROBS,
               f"an integer 0..{MAX_LOGPROBS}")
    if top is not None and not logprobs:
        raise bad("top_logprobs", "top_logprobs needs logprobs: true")
    return ChatParams(
        model=model, messages=messages, max_tokens=max_tokens,
        sampling=sampling, stop=_stop(body["stop"]) if body.get("stop") is not None else (), stream=stream,
        include_usage=include_usage,
        top_logprobs=(top or 0) if logprobs else None,
        ignore_eos=_get(body, "ignore_eos", False, lambda v: isinstance(v, bool), "true or false"),
        add_generation_prompt=_get(body, "add_generation_prompt", True, lambda v: isinstance(v, bool),
                                   "true or false"),
        n=n,
    )


class ChatCompletion:
    """One chat response's identity: the id, creation time and model every chunk of it repeats."""

    def __init__(self, model: str):
        self.id, self.created, self.model = response_id("chatcmpl-"), int(time.time()), model

    def _envelope(self, kind: str, choices: list[dict]) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices,
                "system_fingerprint": None}

    def response(self, text: str, finish_reason: str | None, logprobs: list[dict] | None, prompt_tokens: int,
                 completion_tokens: int) -> dict:
        return self.response_n([(text, finish_reason, logprobs)], prompt_tokens, completion_tokens)

    def response_n(self, choices: list[tuple[str, str | None, list[dict] | None]], prompt_tokens: int,
                   completion_tokens: int) -> dict:
        """choices: (text, finish_reason, logprobs entries or None) of each, in index order."""
        out = [{"index": i, "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None if logprobs is None else {"content": logprobs}, "finish_reason": finish_reason}
               for i, (text, finish_reason, logprobs) in enumerate(choices)]
        return {**self._envelope("chat.completion", out), "usage": usage(prompt_tokens, completion_tokens)}

    def chunk(self, delta: dict, finish_reason: str | None = None, logprobs: list[dict] | None = None,
              index: int = 0) -> dict:
        choice = {"index": index, "delta": delta, "logprobs": None if logprobs is None else {"content": logprobs},
                  "finish_reason": finish_reason}
        return self._envelope("chat.completion.chunk", [choice])

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict:
        return {**self._envelope("chat.completion.chunk", []), "usage": usage(prompt_tokens, completion_tokens)}


def token_logprob(token: str, logprob: float | None, top: dict[str, float]) -> dict:
    """One entry of a chat choice's logprobs.content (OpenAI's shape: bytes as UTF-8 integers)."""
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8")),
            "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))} for t, lp in top.items()]}
