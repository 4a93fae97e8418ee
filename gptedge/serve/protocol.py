"""uvicorn's HTTP/1.1 protocol with a header read timeout and a header size cap: a client must send a request's
complete headers within `header_timeout` seconds of connecting, or of the previous response on a kept-alive
connection, in at most MAX_HEADER_BYTES; otherwise the connection is closed and counted
(`dropped["header_timeout"]`, `dropped["header_too_large"]`).

uvicorn itself bounds only the idle time between requests (keep-alive), so a client sending one
header byte every few seconds held its connection (and a slot of the accept backlog) indefinitely.
The body's own timeout is the app's (limits.read_body), as only the app reads the body.

The base is uvicorn's httptools protocol where httptools is installed (the serve extra installs it), else its h11
one. Why: a streamed token is one chunk written through the protocol, and h11's pure-Python writer (its state
machine, event objects and chunk framing) costs several times httptools' path, which formats the chunk header and
writes: at 64 streaming clients the server's event loop spends its time there (docs/design.md#serving).
h11 bounds a request's headers itself (uvicorn's h11_max_incomplete_event_size, 16 KiB); httptools does not,
so the cap is this class's, and the same for both.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

log = logging.getLogger(__name__)

# a request line and headers past this close the connection with a 431 (checked per read: a read that completes the
# headers is not counted, so up to one read more gets through)
MAX_HEADER_BYTES = 64 * 1024
PROTOCOLS = ("auto", "httptools", "h11")
WRITE_CHUNK = "gptedge.write_chunk"  # scope["extensions"] key: the request's ChunkWriter (httptools' protocol only)


class ChunkWriter:
    """Writes body chunks of one request's chunked response straight to its transport (event_stream.py's fast lane),
    bypassing the ASGI send and its middleware layers; the bytes are those uvicorn's httptools send writes for a
    body message with more_body. ready() says whether a write now would be one that send makes at once: the
    response started, chunked, not complete, the client there, the socket not paused (send would wait for it to
    drain, and a chunk written meanwhile would overtake the one waiting)."""

    __slots__ = ("_cycle",)

    def __init__(self, cycle):
        self._cycle = cycle  # uvicorn's httptools RequestResponseCycle

    def ready(self) -> bool:
        c = self._cycle
        return (c.response_started and not c.response_complete and not c.disconnected and c.chunked_encoding is True
                and c.scope["method"] != "HEAD" and not c.flow.write_paused and not c.transport.is_closing())

    def write(self, body: bytes) -> None:
        if body:
            self._cycle.transport.write(b"%x\r\n%b\r\n" % (len(body), body))


def base_protocol(name: str = "auto") -> type[asyncio.Protocol]:
    """uvicorn's protocol class for `name`: httptools, h11, or auto (httptools when it imports, else h11)."""
    if name not in PROTOCOLS:
        raise ValueError(f"http protocol must be one of {', '.join(PROTOCOLS)}, got {name!r}")
    if name in ("auto", "httptools"):
        try:
            from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
            return HttpToolsProtocol
        except ImportError:  # httptools is not installed
            if name == "httptools":
                raise
            log.info("httptools is not installed: serving through h11 (slower per streamed token)")
    from uvicorn.protocols.http.h11_impl import H11Protocol
    return H11Protocol


def timed_protocol(header_timeout: float, dropped: Counter, base: type[asyncio.Protocol] | None = None) -> type:
    """A protocol class (uvicorn.Config(http=...)) over `base` (default base_protocol()) enforcing
    `header_timeout` and MAX_HEADER_BYTES, counting drops in `dropped`."""
    base = base or base_protocol()
    writes_chunks = base.__name__ == "HttpToolsProtocol"  # h11's writer keeps state a direct write would bypass

    class TimedProtocol(base):
        _timer: asyncio.TimerHandle | None = None
        _waiting_cycle = None  # the cycle current when the timer was armed: a new one means headers arrived
        _partial = False  # bytes of the awaited request have arrived (else the connection is merely idle)
        _header_bytes = 0  # bytes received while the awaited request's headers are incomplete

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            self._partial = True
            # bytes of a new request's head: not the rest of a body the app answered before reading it all
            heading = self._timer is not None and (self.cycle is None or not self.cycle.more_body)
            super().data_received(data)
            self._disarm_if_headers_came()
            if heading and self._timer is not None:  # still no complete headers
                self._header_bytes += len(data)
                if self._header_bytes > MAX_HEADER_BYTES and not self.transport.is_closing():
                    self._cancel()
                    dropped["header_too_large"] += 1
                    self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n"
                                         b"connection: close\r\n\r\n")
                    self.transport.close()

        if writes_chunks:
            def on_headers_complete(self) -> None:
                super().on_headers_complete()  # makes the cycle; its ASGI task has not run yet
                self.scope.setdefault("extensions", {})[WRITE_CHUNK] = ChunkWriter(self.cycle)

        def on_response_complete(self) -> None:
            super().on_response_complete()  # may start the next pipelined request at once
            if self.cycle is not None and not self.cycle.response_complete:
                return  # a pipelined request runs: its headers came; the timer waits for the next response's end
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc) -> None:
            self._cancel()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._cancel()
            self._waiting_cycle, self._partial, self._header_bytes = self.cycle, False, 0
            self._timer = self.loop.call_later(header_timeout, self._expired)

        def _cancel(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _disarm_if_headers_came(self) -> None:
            if self._timer is not None and self.cycle is not self._waiting_cycle:
                self._cancel()

        def _expired(self) -> None:
            self._timer = None
            if self.cycle is self._waiting_cycle and not self.transport.is_closing():
                if self._partial:  # an idle kept-alive connection is just closed, as keep-alive would
                    dropped["header_timeout"] += 1
                self.transport.close()

    TimedProtocol.__name__ = f"Timed{base.__name__}"
    return TimedProtocol
