"""What one client can cost the server, bounded before the work (docs/serving.md#what-one-client-can-cost).

- The request body: at most `max_body` bytes, enforced while it is read (a Content-Length over it is
  refused before a byte is read; a body that grows past it stops being read), and within `body_timeout`
  seconds of the headers (a slow body gets 408 and its connection closed). Headers must be complete
  within `header_timeout` seconds of the connection (or of the previous response): see protocol.py.
- JSON: nested at most MAX_JSON_DEPTH deep (measured on the bytes, before parsing), and every string
  in it real Unicode (a lone surrogate such as "\\ud800" from a JSON escape is a 400, not a crash in
  the tokenizer).
- A prompt's text: at most context x (the longest token's bytes), checked before tokenization. No
  longer text can fit the context (each token covers at most that many bytes), so nothing that could
  succeed is refused, and a 50 MB prompt costs a length check, not a tokenization.
- A client that leaves mid-body, or that the server stops reading, is counted (`dropped`), never logged
  with a traceback.

No HTTP framework here: app.py calls these with the ASGI receive callable and the body's bytes.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

from .openai_schema import ApiError
from .options import DEFAULT_BODY_TIMEOUT_S, DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_BODY

MAX_JSON_DEPTH = 32  # OpenAI's completions body needs 3 (a list of lists of token ids)
POLL_S = 0.1  # how often a body read looks at the shutdown flag
CLOSE = {"Connection": "close"}  # an answer before the whole body was read: the connection cannot be reused

_JSON_STRING = re.compile(rb'"[^"]*"')  # once escapes are gone a string holds no quote: one C-speed scan
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


class ClientGone(Exception):
    """The client closed its connection before the response was complete."""


@dataclass(frozen=True)
class Limits:
    max_body: int = DEFAULT_MAX_BODY  # bytes
    header_timeout: float = DEFAULT_HEADER_TIMEOUT_S  # seconds, connection (or last response) to complete headers
    body_timeout: float = DEFAULT_BODY_TIMEOUT_S  # seconds, headers to complete body
    max_json_depth: int = MAX_JSON_DEPTH
    http: str = "auto"  # uvicorn's HTTP/1.1 protocol under the limits (protocol.base_protocol): auto, httptools, h11


# why a request was not read to its end (/metrics: gptedge_http_dropped_total{reason=...})
DROP_REASONS = ("client_disconnect", "header_timeout", "header_too_large", "body_timeout", "body_too_large",
                "shutdown")


def _content_length(headers) -> int | None:
    value = headers.get("content-length")
    if value is None:
        return None
    if not value.isdigit():
        raise ApiError(400, "Content-Length is not a number", headers=CLOSE)
    return int(value)


async def read_body(receive, headers, limits: Limits, stopping, dropped: Counter) -> bytes:
    """The whole request body, or ApiError (413 too large, 408 too slow, 503 shutting down) / ClientGone.
    `stopping()` says the server is shutting down: a body still arriving then is not waited for."""
    length = _content_length(headers)
    if length is not None and length > limits.max_body:
        dropped["body_too_large"] += 1
        raise ApiError(413, f"the request body is {length:,} bytes; this server takes at most {limits.max_body:,} "
                            "(--max-body)", code="request_too_large", headers=CLOSE)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limits.body_timeout
    chunks, size, pending = [], 0, None
    try:
        while True:
            pending = pending or asyncio.ensure_future(receive())
            left = deadline - loop.time()
            done = (await asyncio.wait({pending}, timeout=min(max(left, 0), POLL_S)))[0] if left > 0 else ()
            if stopping():
                dropped["shutdown"] += 1
                raise ApiError(503, "the server is shutting down", "server_error", code="shutting_down", headers=CLOSE)
            if not done:
                if loop.time() >= deadline:
                    dropped["body_timeout"] += 1
                    raise ApiError(408, f"the request body did not arrive within {limits.body_timeout:g} s "
                                        "(--body-timeout)", code="request_timeout", headers=CLOSE)
                continue
            message, pending = pending.result(), None
            if message["type"] == "http.disconnect":
                dropped["client_disconnect"] += 1
                raise ClientGone()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limits.max_body:
                dropped["body_too_large"] += 1
                raise ApiError(413, f"the request body passed {limits.max_body:,} bytes; this server takes no more "
                                    "(--max-body)", code="request_too_large", headers=CLOSE)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)
    finally:
        if pending is not None:
            pending.cancel()


def json_depth(body: bytes, at_most: int = 0) -> int:
    """How deeply the arrays and objects of a JSON text nest, from its bytes alone: escapes dropped (pairs
    of backslashes first, as JSON reads them from the left), strings cut out, brackets kept, then a running
    sum. Every pass is C speed (a 4 MiB body of '[' in tens of milliseconds), and no parser recursion is
    involved. Returns early with the bracket count when that is at most `at_most` (a sane body)."""
    opens = body.count(b"[") + body.count(b"{")
    if opens <= at_most:
        return opens
    text = _JSON_STRING.sub(b"", body.replace(b"\\\\", b"").replace(b'\\"', b""))
    brackets = np.frombuffer(text.translate(None, _NOT_BRACKETS), np.uint8)
    if not len(brackets):
        return 0
    steps = (brackets & 2).astype(np.int32) - 1  # '[' 0x5b and '{' 0x7b have bit 1 set: +1; ']' '}': -1
    return int(np.cumsum(steps).max())


def parse_json(body: bytes, limits: Limits):
    """Bytes -> the decoded JSON value, or ApiError(400) saying what is wrong with it."""
    depth = json_depth(body, limits.max_json_depth)
    if depth > limits.max_json_depth:
        raise ApiError(400, f"the request body nests {depth} levels deep; at most {limits.max_json_depth} are allowed")
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ApiError(400, "the request body is not valid JSON") from None
    check_unicode(value)
    return value


def check_unicode(value) -> None:
    """Every string of a decoded JSON value (keys too) must be encodable: JSON may escape a lone surrogate
    ("\\ud800"), which is not text. The 400 names the top-level field that holds it."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
        return
    except UnicodeEncodeError:
        pass
    where = None
    if isinstance(value, dict):
        for key, item in value.items():
            try:
                json.dumps({key: item}, ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError:
                where = key.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
                break
    raise ApiError(400, "the request body holds a lone surrogate (an escape such as \\ud800 that is not text)"
                        + (f" in {where!r}" if where else ""), param=where)


def longest_token_bytes(tokenizer, vocab_size: int) -> int:
    """The most bytes any one token's text has (GPT-2: 128)."""
    texts = tokenizer.decode_batch([[i] for i in range(min(vocab_size, tokenizer.get_vocab_size()))],
                                   skip_special_tokens=False)
    return max((len(t.encode("utf-8")) for t in texts), default=1) or 1


def check_prompt_bytes(prompts, limit: int) -> None:
    """Text prompts longer than `limit` bytes cannot fit the context: a 400 before tokenization."""
    for p in prompts:
        if isinstance(p, str) and (size := len(p.encode("utf-8"))) > limit:  # check_unicode ran: it encodes
            raise ApiError(400, f"the prompt is {size:,} bytes; no text over {limit:,} bytes fits the model's "
                                "context; shorten the prompt", param="prompt", code="context_length_exceeded")
