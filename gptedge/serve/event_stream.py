"""Engine events to the event loop, and from there to the client as Server-Sent Events (docs/serving.md).

The engine thread produces one event per running request per step; at 64 streaming clients on a GPU that is one
event every ~30 us, each to be handed to the loop, turned into a chunk and written to a socket. Three things keep
that cheap:

- `Job` gathers a request's events under a lock; the reader takes everything gathered since it last looked.
- `LoopWaker` wakes waiting readers with one `call_soon_threadsafe` per loop turn, not one per reader: each
  call writes to the loop's self-pipe (a syscall on the engine thread) and makes the loop run one callback; 64
  readers woken by one step cost one of each.
- `EventStream` writes the chunks of the events a reader took at once as one body: a reader that fell behind
  (more than one event gathered) catches up in one write instead of one per token. A reader that keeps up still
  gets each token in its own write, as soon as it is produced.
- The fast lane: while the reader waits, a plain token's event (text, no finish, no logprobs) need not wake it.
  Where the server's protocol offers a chunk writer (protocol.py, WRITE_CHUNK), the waker's callback formats
  the chunks of the leading plain events and writes them to the socket itself; only the rest (a finish, an error,
  logprobs, a paused or closed socket) wakes the reader, which takes them in order. Per token this skips the
  reader task's wake-up, two async generators and the ASGI send's middleware layers: at 64 clients on a GPU the
  event loop shares one GIL with the engine thread, and its cost per token is what the batch's tokens wait for.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import weakref
from collections.abc import AsyncIterator

from gptedge.runtime.serving.engine import CompletionRequest, Engine, TokenEvent

from .limits import ClientGone
from .protocol import WRITE_CHUNK
from .routes import _wait_disconnect

log = logging.getLogger(__name__)


class LoopWaker:
    """Wakes futures of one event loop from other threads, batching the wakes of one loop turn into one callback."""

    _by_loop: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    _made = threading.Lock()

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = weakref.ref(loop)  # weak: the registry's value must not keep its key (the loop) alive
        self._lock = threading.Lock()
        self._due: list[asyncio.Future] = []  # futures to wake at the next callback
        self._scheduled = False  # a callback is queued on the loop and has not run yet

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> LoopWaker:
        """The loop's one waker (made at first use)."""
        with cls._made:
            waker = cls._by_loop.get(loop)
            if waker is None:
                waker = cls._by_loop[loop] = cls(loop)
            return waker

    def wake(self, waiter) -> None:  # any thread; waiter: a future to resolve, or a callable to call, on the loop
        with self._lock:
            self._due.append(waiter)
            schedule, self._scheduled = not self._scheduled, True
        if schedule:
            loop = self._loop()
            try:
                if loop is None:
                    raise RuntimeError("the loop is gone")
                loop.call_soon_threadsafe(self._run)
            except RuntimeError:  # the loop is closed (or gone): nobody listens any more
                with self._lock:
                    self._due.clear()
                    self._scheduled = False

    def _run(self) -> None:  # on the loop
        with self._lock:
            due, self._due, self._scheduled = self._due, [], False
        for waiter in due:
            if isinstance(waiter, asyncio.Future):
                _wake(waiter)
                continue
            try:
                waiter()
            except Exception:  # one job's failure must not keep the others of this turn asleep
                log.exception("a stream's wake-up failed")


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():  # a reader cancelled while waiting left it cancelled
        waiter.set_result(None)


class Job:
    """One completion's engine requests (one per prompt), and their events as (index, TokenEvent) on the loop.

    The engine thread appends each event under a lock and wakes the loop (LoopWaker) only when the reader is
    waiting; the reader takes everything gathered since at once. No asyncio.Queue: a queue's `get` awaited beside
    the disconnect future cost a task and an `asyncio.wait` per token on the event loop, the thread that shares
    the cores with ONNX Runtime's."""

    def __init__(self, engine: Engine):
        self.engine, self.loop = engine, asyncio.get_running_loop()
        self._waker = LoopWaker.of(self.loop)
        self._lock = threading.Lock()
        self._items: list[tuple[int, TokenEvent]] = []  # events the reader has not taken yet
        self._waiter: asyncio.Future | None = None  # set while the reader waits for the next event
        self.handles = []
        self.unread = 0  # events the reader took at once and has not yielded yet (EventStream batches on it)
        self.before_wait = None  # an async callable the reader awaits before it waits for more (EventStream's flush)
        # the fast lane (set by EventStream, called on the loop while the reader waits): fast(items) -> how many of
        # the leading items it delivered itself; the rest wake the reader
        self.fast = None
        self._scheduled = False  # a callback for this job is queued on the loop (LoopWaker) and has not run yet
        self._parked = False  # the reader awaits its waiter, past its before_wait (set and read on the loop)

    def submit(self, requests: list[CompletionRequest]) -> None:
        """All or nothing (the engine's submit_all): each is checked, then queued; a refusal queues none."""
        self.handles = self.engine.submit_all(requests, [functools.partial(self._on_event, i)
                                                         for i in range(len(requests))])

    def _on_event(self, index: int, event: TokenEvent) -> None:  # on the engine thread
        with self._lock:
            self._items.append((index, event))
            schedule = self._waiter is not None and not self._scheduled
            self._scheduled = self._scheduled or schedule
        if schedule:
            self._waker.wake(self._on_loop)

    def _on_loop(self) -> None:  # on the loop (LoopWaker): events arrived while the reader waited
        with self._lock:
            self._scheduled = False
            waiter, fast = self._waiter, self.fast if self._parked else None
            if waiter is None or waiter.done() or not self._items:
                return  # the reader was woken otherwise (the client left) and takes the events itself
            items = self._items
            if fast is not None:
                self._items = []
            else:
                self._waiter = None
        if fast is not None:
            try:
                delivered = fast(items)
            except Exception:  # the reader takes them all (and meets the error where a stream's errors are handled)
                log.exception("the stream's fast lane failed; the reader takes its events")
                delivered = 0
            if delivered == len(items):
                return  # every one written: the reader waits on
            with self._lock:
                self._items[:0] = items[delivered:]  # before any that arrived meanwhile
                self._waiter = None
        _wake(waiter)

    def _wake_reader(self, _gone: asyncio.Future) -> None:  # on the loop: the client went away
        with self._lock:
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            _wake(waiter)

    def cancel(self) -> None:
        for h in self.handles:
            h.cancel()

    async def events(self, gone: asyncio.Future) -> AsyncIterator[tuple[int, TokenEvent]]:
        """Every event until each request has finished; ClientGone as soon as `gone` completes while none is
        waiting to be read."""
        remaining = len(self.handles)
        gone.add_done_callback(self._wake_reader)
        try:
            while remaining:
                with self._lock:
                    items, self._items = self._items, []
                    waiter = self._waiter = self.loop.create_future() if not items else None
                if waiter is not None:
                    if gone.done():
                        raise ClientGone()
                    if self.before_wait is not None:
                        await self.before_wait()
                    self._parked = True  # only now may the fast lane write: nothing of the reader's is in flight
                    try:
                        await waiter
                    finally:
                        self._parked = False
                    continue
                for k, item in enumerate(items):
                    remaining -= item[1].finish_reason is not None
                    self.unread = len(items) - k - 1
                    yield item
                self.unread = 0
        finally:
            gone.remove_done_callback(self._wake_reader)


class EventStream:
    """A raw ASGI response sending Server-Sent Events; it owns the job and cancels it however it ends.

    The data of events the job handed over together (job.unread > 0 after one) go out in one body, sent at the
    latest when the reader is about to wait for more (job.before_wait)."""

    def __init__(self, job: Job, chunks, plain=None):
        self.job, self.chunks = job, chunks  # chunks(gone) -> async iterator of data strings
        # plain(index, event) -> a plain token's data ("": none to send), or None for any other event (the fast
        # lane's: it must leave the route's state as chunks would after the same event)
        self.plain = plain

    async def __call__(self, scope, receive, send) -> None:
        gone = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream; charset=utf-8"),
                                    (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]})
            writer = (scope.get("extensions") or {}).get(WRITE_CHUNK)
            if writer is not None and self.plain is not None:
                self.job.fast = functools.partial(self._write_plain, writer)
            held: list[str] = []

            async def flush() -> None:
                if held:
                    body = "".join(held).encode()
                    held.clear()
                    await send({"type": "http.response.body", "body": body, "more_body": True})

            self.job.before_wait = flush  # an event with no text must not leave earlier text held while it waits
            async for data in self.chunks(gone):
                held.append(f"data: {data}\n\n")
                if not self.job.unread:  # nothing more was handed over with this event: send what is held
                    await flush()
            await flush()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except (ClientGone, OSError):
            log.info("client went away mid-stream; its requests are cancelled")
        finally:
            self.job.fast = None
            gone.cancel()
            self.job.cancel()

    def _write_plain(self, writer, items: list[tuple[int, TokenEvent]]) -> int:
        """The fast lane (on the loop, the reader parked): write the leading plain events' chunks in one body ->
        how many events it took (the reader takes the rest, in order)."""
        if not writer.ready():
            return 0
        data, taken = [], 0
        for index, event in items:
            try:
                piece = self.plain(index, event)
            except Exception:  # the reader takes it and meets the same error where a stream's errors are handled
                log.exception("the stream's fast lane failed on an event; the reader takes it")
                break
            if piece is None:
                break
            taken += 1
            if piece:
                data.append(f"data: {piece}\n\n")
        if data:
            writer.write("".join(data).encode())
        return taken
