"""The server's limits (gptedge/serve/limits.py) on plain data, each at the limit and one past it: the body's size
while it is read (declared and chunked), its time, a shutdown, a client that leaves, JSON depth, lone surrogates
and the prompt's bytes. No server: a fake ASGI receive (test_serve_hostile.py checks the same over real sockets)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from gptedge.serve.limits import (
    CLOSE,
    DROP_REASONS,
    MAX_JSON_DEPTH,
    ClientGone,
    Limits,
    check_prompt_bytes,
    check_unicode,
    json_depth,
    longest_token_bytes,
    parse_json,
    read_body,
)
from gptedge.serve.openai_schema import ApiError


SMALL = Limits(max_body=10)


def _read(chunks, limits=SMALL, headers=None, stopping=lambda: False, delay=0.0, dropped=None):
    """read_body over `chunks` (bytes, or a dict message) -> (its result or its exception, the drop counter)."""
    messages = [c if isinstance(c, dict) else {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
                for i, c in enumerate(chunks)]

    async def receive():
        if delay:
            await asyncio.sleep(delay)
        return messages.pop(0)

    dropped = Counter() if dropped is None else dropped

    async def main():
        try:
            return await read_body(receive, headers or {}, limits, stopping, dropped)
        except (ApiError, ClientGone) as e:
            return e

    return asyncio.run(main()), dropped


def test_a_body_of_exactly_max_body_is_read_whole():
    assert _read([b"12345", b"67890"]) == (b"1234567890", Counter())
    assert _read([b"1234567890"], headers={"content-length": "10"})[0] == b"1234567890"
    assert _read([b""])[0] == b""


def test_a_chunked_body_one_byte_past_max_body_is_413_and_counted():
    err, dropped = _read([b"12345", b"678901"])
    assert isinstance(err, ApiError) and (err.status, err.code, err.headers) == (413, "request_too_large", CLOSE)
    assert err.message == "the request body passed 10 bytes; this server takes no more (--max-body)"
    assert dropped == Counter(body_too_large=1)


def test_a_declared_length_one_past_max_body_is_413_before_reading():
    err, dropped = _read([], limits=Limits(max_body=4096), headers={"content-length": "4097"})
    assert (err.status, err.code, err.headers) == (413, "request_too_large", CLOSE)
    assert err.message == "the request body is 4,097 bytes; this server takes at most 4,096 (--max-body)"
    assert dropped == Counter(body_too_large=1)
    err, _ = _read([b"x"], headers={"content-length": "1x"})
    assert (err.status, err.message, err.headers) == (400, "Content-Length is not a number", CLOSE)


def test_a_client_that_leaves_mid_body_is_counted():
    err, dropped = _read([{"type": "http.request", "body": b"12", "more_body": True}, {"type": "http.disconnect"}])
    assert isinstance(err, ClientGone) and dropped == Counter(client_disconnect=1)


def test_a_body_slower_than_body_timeout_is_408():
    err, dropped = _read([b"1"], limits=Limits(max_body=10, body_timeout=0.05), delay=1.0)
    assert (err.status, err.code, err.headers) == (408, "request_timeout", CLOSE)
    assert err.message == "the request body did not arrive within 0.05 s (--body-timeout)"
    assert dropped == Counter(body_timeout=1)
    assert _read([b"1"], limits=Limits(max_body=10, body_timeout=2.0), delay=0.15)[0] == b"1"  # > one poll: waited


def test_a_body_still_arriving_at_shutdown_is_503():
    err, dropped = _read([b"1"], stopping=lambda: True, delay=1.0)
    assert (err.status, err.type, err.code, err.headers) == (503, "server_error", "shutting_down", CLOSE)
    assert dropped == Counter(shutdown=1)


@pytest.mark.parametrize("body, depth", [
    (b"", 0), (b"1", 0), (b"[]", 1), (b'{"a": [1, {"b": [[]]}]}', 5), (b"[[],[],[]]", 2),
    (b'["[[[[", "]]]"]', 1),  # brackets inside strings do not count
    (b'["\\"[[[", "\\\\", "["]', 1),  # an escaped quote, an escaped backslash ending a string
])
def test_json_depth(body, depth):
    assert json_depth(body) == depth


def test_json_depth_returns_early_with_the_bracket_count():
    assert json_depth(b"[[]]", at_most=2) == 2  # two brackets, at most 2: the count, no scan
    assert json_depth(b"[][][]", at_most=2) == 1  # three: scanned


def test_json_exactly_at_the_depth_limit_parses_and_one_deeper_is_400():
    limits = Limits(max_json_depth=3)
    assert parse_json(b"[[[1]]]", limits) == [[[1]]]
    with pytest.raises(ApiError, match=r"^the request body nests 4 levels deep; at most 3 are allowed$") as e:
        parse_json(b"[[[[1]]]]", limits)
    assert e.value.status == 400
    assert MAX_JSON_DEPTH == Limits().max_json_depth == 32
    deep = b"[" * 32 + b"]" * 32
    assert json_depth(parse_json(deep, Limits()) and deep) == 32
    with pytest.raises(ApiError, match="nests 33 levels"):
        parse_json(b"[" * 33 + b"]" * 33, Limits())


@pytest.mark.parametrize("body", [b"{", b"\xff", b'{"a": 1} x', b"nan"])
def test_bad_json_is_one_400(body):
    with pytest.raises(ApiError, match="^the request body is not valid JSON$") as e:
        parse_json(body, Limits())
    assert e.value.status == 400


def test_a_lone_surrogate_is_400_naming_its_field():
    with pytest.raises(ApiError, match=r"holds a lone surrogate .* in 'prompt'$") as e:
        parse_json(b'{"model": "m", "prompt": "a\\ud800b"}', Limits())
    assert (e.value.status, e.value.param) == (400, "prompt")
    with pytest.raises(ApiError, match=r"that is not text\)$") as e:  # not under a top-level key: no field named
        check_unicode(["\ud800"])
    assert e.value.param is None
    check_unicode({"prompt": "\U0001f600 fine", "n": [1, {"x": "é"}]})
    assert parse_json(b'{"p": "\\ud83d\\ude00"}', Limits()) == {"p": "\U0001f600"}  # a pair is a character


def test_a_prompt_exactly_at_the_byte_limit_passes_and_one_byte_more_is_400():
    check_prompt_bytes(["é" * 5, [1, 2, 3] * 100], 10)  # 10 bytes; token ids are not measured
    with pytest.raises(ApiError) as e:
        check_prompt_bytes(["ok", "é" * 5 + "x"], 10)
    assert (e.value.status, e.value.param, e.value.code) == (400, "prompt", "context_length_exceeded")
    assert e.value.message == ("the prompt is 11 bytes; no text over 10 bytes fits the model's context; "
                               "shorten the prompt")
    with pytest.raises(ApiError, match="the prompt is 1,001 bytes; no text over 1,000 bytes"):
        check_prompt_bytes(["a" * 1001], 1000)


class FakeTokenizer:
    def __init__(self, texts):
        self.texts = texts

    def get_vocab_size(self):
        return len(self.texts)

    def decode_batch(self, batches, skip_special_tokens):
        assert skip_special_tokens is False
        return [self.texts[ids[0]] for ids in batches]


def test_the_longest_tokens_bytes():
    assert longest_token_bytes(FakeTokenizer(["a", "éé", "abc", "\U0001f600"]), 4) == 4  # 4 bytes, 1 character
    assert longest_token_bytes(FakeTokenizer(["a", "éé", "abcdefgh"]), 2) == 4  # only the model's vocabulary
    assert longest_token_bytes(FakeTokenizer(["", ""]), 2) == 1  # never 0: the limit stays above 0
    assert longest_token_bytes(FakeTokenizer([]), 5) == 1
    assert json.dumps(CLOSE) == '{"Connection": "close"}'


def test_a_last_message_without_more_body_ends_the_body():
    """ASGI's more_body defaults to False: a server that waited for more would answer 408 to every such client."""
    err, dropped = _read([{"type": "http.request", "body": b"ab", "more_body": True}, {"type": "http.request",
                                                                                          "body": b"c"}])
    assert err == b"abc" and dropped == Counter()
    assert _read([{"type": "http.request"}])[0] == b""  # no body key at all: empty


def test_json_depth_early_return_is_the_bracket_count_only_up_to_at_most():
    assert json_depth(b"[][]", at_most=2) == 2  # 2 brackets <= 2: the count (an upper bound), not scanned
    assert json_depth(b"[][]", at_most=1) == 1  # 2 > 1: scanned, the real depth
    assert json_depth(b'"[[" ', at_most=0) == 0  # only brackets inside a string: depth 0


def test_a_lone_surrogate_in_a_key_is_named_escaped():
    with pytest.raises(ApiError, match=r"in '\\\\udc80x'$") as e:
        parse_json(b'{"\\udc80x": 1}', Limits())
    assert e.value.param == "\\udc80x"


def test_drops_are_counted_on_top_of_earlier_ones():
    """/metrics shows gptedge_http_dropped_total{reason=...} for each of DROP_REASONS: a running count, not a flag."""
    assert DROP_REASONS == ("client_disconnect", "header_timeout", "header_too_large", "body_timeout", "body_too_large",
                            "shutdown")
    cases = [([], {"headers": {"content-length": "11"}}, "body_too_large"),
             ([b"12345678901"], {}, "body_too_large"),
             ([{"type": "http.disconnect"}], {}, "client_disconnect"),
             ([b"1"], {"limits": Limits(max_body=10, body_timeout=0.01), "delay": 1.0}, "body_timeout"),
             ([b"1"], {"stopping": lambda: True, "delay": 1.0}, "shutdown")]
    for chunks, kwargs, reason in cases:
        dropped = Counter({r: 5 for r in DROP_REASONS})
        _read(chunks, dropped=dropped, **kwargs)
        assert dropped == Counter({r: 6 if r == reason else 5 for r in DROP_REASONS}), reason


class _Transport:
    def __init__(self):
        self.written, self.closed = b"", False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


class _Cycle:
    def __init__(self, response_complete: bool, more_body: bool):
        self.response_complete, self.more_body = response_complete, more_body


def _timed(cycle=None):
    """gptedge's timed protocol over a stand-in for uvicorn's (the parser's effects are set by hand)."""
    import asyncio
    from collections import Counter

    from gptedge.serve.protocol import timed_protocol

    class Base(asyncio.Protocol):
        def __init__(self, loop):
            self.loop, self.cycle, self.transport = loop, cycle, None

        def connection_made(self, transport):
            self.transport = transport

        def data_received(self, data):
            pass

        def on_response_complete(self):
            pass

        def connection_lost(self, exc):
            pass

    dropped = Counter()
    loop = asyncio.new_event_loop()
    protocol = timed_protocol(10.0, dropped, base=Base)(loop)
    protocol.connection_made(_Transport())
    return protocol, dropped, loop


def test_headers_past_the_cap_are_a_431_and_counted():
    protocol, dropped, loop = _timed()
    for _ in range(65):
        protocol.data_received(b"x" * 1024)  # 65 KiB of a head that never ends
    assert protocol.transport.closed and protocol.transport.written.startswith(b"HTTP/1.1 431 ")
    assert dropped["header_too_large"] == 1
    loop.close()


def test_the_rest_of_a_body_answered_early_is_not_counted_as_headers():
    """The app answered (a 401) before reading a large body; the body's remaining bytes are not a new head."""
    protocol, dropped, loop = _timed(_Cycle(response_complete=True, more_body=True))
    protocol.on_response_complete()  # armed: the next request's headers are awaited
    for _ in range(200):
        protocol.data_received(b"x" * 1024)
    assert not protocol.transport.closed and dropped["header_too_large"] == 0
    loop.close()


def test_a_pipelined_request_running_is_not_timed_as_headers():
    """The next request's headers came with the last one's: it runs as that response completes, and no header timer
    may cut it off mid-response."""
    protocol, dropped, loop = _timed(_Cycle(response_complete=False, more_body=False))
    protocol._cancel()  # its headers came: no timer
    protocol.on_response_complete()
    assert protocol._timer is None
    protocol.cycle = _Cycle(response_complete=True, more_body=False)
    protocol.on_response_complete()  # its own response done: now the next request's headers are awaited
    assert protocol._timer is not None
    loop.close()
