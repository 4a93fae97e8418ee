"""The streaming route's per-token path, without a model: the engine thread's events reach the reader in order
however they bunch up, a client that leaves ends the wait at once, and a text chunk's JSON equals the general
encoder's byte for byte."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

pytest.importorskip("starlette")

from gptedge.runtime.serving.requests import FinishReason, TokenEvent  # noqa: E402 - after the skip
from gptedge.serve.app import _dumps, _text_chunk  # noqa: E402 - after the skip
from gptedge.serve.event_stream import EventStream, Job, LoopWaker  # noqa: E402 - after the skip
from gptedge.serve.limits import ClientGone  # noqa: E402 - after the skip
from gptedge.serve.openai_schema import Completion  # noqa: E402 - after the skip


class _Handles:
    """An engine stand-in: submit_all hands back one handle per request and keeps each callback."""

    def __init__(self):
        self.callbacks, self.cancelled = [], 0

    def submit_all(self, requests, on_events):
        self.callbacks = list(on_events)
        return [self] * len(requests)

    def cancel(self):
        self.cancelled += 1


def _event(text: str, last: bool = False) -> TokenEvent:
    return TokenEvent(text, 1, finish_reason=FinishReason.LENGTH if last else None)


def test_events_from_another_thread_arrive_in_order_bunched_or_not():
    async def main():
        engine = _Handles()
        job = Job(engine)
        job.submit([object(), object()])  # two requests: both must finish
        gone = asyncio.get_running_loop().create_future()

        def produce():
            for k in range(200):  # bursts and gaps alike: the reader sometimes waits, sometimes finds several
                engine.callbacks[k % 2](_event(str(k)))
                if k % 17 == 0:
                    threading.Event().wait(0.001)
            engine.callbacks[0](_event("end0", last=True))
            engine.callbacks[1](_event("end1", last=True))

        thread = threading.Thread(target=produce)
        thread.start()
        got = [(i, e.text) async for i, e in job.events(gone)]
        thread.join()
        return got

    got = asyncio.run(asyncio.wait_for(main(), 30))  # a reader never woken fails here instead of hanging
    assert got == [(k % 2, str(k)) for k in range(200)] + [(0, "end0"), (1, "end1")]


def test_a_client_that_leaves_ends_the_wait_and_unread_events_come_first():
    async def main():
        engine = _Handles()
        job = Job(engine)
        job.submit([object()])
        loop = asyncio.get_running_loop()
        gone = loop.create_future()
        engine.callbacks[0](_event("a"))  # already waiting to be read when the client leaves
        loop.call_later(0.05, gone.set_result, None)
        got = []
        with pytest.raises(ClientGone):
            async for _, event in job.events(gone):
                got.append(event.text)
        return got

    assert asyncio.run(asyncio.wait_for(main(), 10)) == ["a"]


def test_an_event_after_the_loop_closed_is_dropped_quietly():
    engine = _Handles()

    async def main():
        job = Job(engine)
        job.submit([object()])
        gone = asyncio.get_running_loop().create_future()
        reader = asyncio.ensure_future(job.events(gone).__anext__())
        await asyncio.sleep(0)  # the reader now waits
        reader.cancel()
        return job

    job = asyncio.run(main())
    engine.callbacks[0](_event("late"))  # the loop is closed: nobody listens, nothing raises
    assert job._items == [(0, _event("late"))]


@pytest.mark.parametrize("text", ["", "x", " the", 'a "quoted" \\ back', "tab\tnew\nline\r\x00\x1f", "é ü ß", "👍🏽",
                                  "\u2028\u2029", "</script>", "\x00gptedge-text"])
def test_a_text_chunk_is_the_general_encoders_json(text):
    out, templates = Completion("bench"), {}
    for index in (0, 3, 0):  # a template per choice, reused
        fast = _text_chunk(out, templates, index, text)
        assert fast == _dumps(out.chunk(index, text))
        assert json.loads(fast)["choices"] == [{"index": index, "text": text, "logprobs": None, "finish_reason": None}]
    assert sorted(templates) == [0, 3]


@pytest.mark.parametrize("name", ["odd\x00gptedge-text\x00name", "\x00gptedge-text\x00"])
def test_a_model_name_holding_the_marker_still_gets_the_general_encoders_json(name):
    out, templates = Completion(name), {}
    assert _text_chunk(out, templates, 0, "hi") == _dumps(out.chunk(0, "hi"))
    assert (templates == {}) == (name == "\x00gptedge-text\x00")  # only a name equal to it needs the fallback


def test_a_latency_lands_in_the_first_bucket_at_or_above_it():
    from gptedge.runtime.serving.metrics import Histogram

    h = Histogram("h", "help", (0.01, 0.1, 1.0))
    for value in (0.0, 0.01, 0.010001, 0.1, 0.5, 1.0, 2.0, float("inf")):
        h.observe(value)
    assert h.counts == [2, 2, 2, 2]  # le=0.01 holds 0.01 itself (Prometheus' `le`); above every bucket: +Inf


def test_wakes_from_another_thread_in_one_loop_turn_cost_one_callback():
    """64 readers woken by one engine step: one call_soon_threadsafe (one self-pipe write), every reader woken."""
    async def main():
        loop = asyncio.get_running_loop()
        calls = []
        real = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *a: (calls.append(a), real(*a))[1]
        waker = LoopWaker.of(loop)
        assert LoopWaker.of(loop) is waker  # one per loop
        waiters = [loop.create_future() for _ in range(64)]
        thread = threading.Thread(target=lambda: [waker.wake(w) for w in waiters])
        thread.start()
        thread.join()  # every wake lands before the loop runs again
        await asyncio.wait_for(asyncio.gather(*waiters), 10)
        first = len(calls)
        later = loop.create_future()
        threading.Thread(target=waker.wake, args=(later,)).start()
        await asyncio.wait_for(later, 10)  # a wake after the callback ran schedules a new one
        return first, len(calls)

    assert asyncio.run(main()) == (1, 2)


def _stream_bodies(burst: int, steps: int) -> list[bytes]:
    """The bodies an EventStream sends when the engine hands over `burst` events between the reader's looks."""
    async def main():
        engine = _Handles()
        job = Job(engine)
        job.submit([object()])
        bodies = []

        async def chunks(gone):
            async for _, event in job.events(gone):
                yield event.text

        async def receive():
            await asyncio.Event().wait()  # the client never leaves

        async def send(message):
            if message["type"] == "http.response.body":
                bodies.append(message["body"])

        async def produce():
            for s in range(steps):
                for k in range(burst):
                    last = s == steps - 1 and k == burst - 1
                    engine.callbacks[0](_event(f"{s}.{k}", last=last))
                await asyncio.sleep(0.01)  # the reader takes what was handed over, then waits

        await asyncio.gather(EventStream(job, chunks)({}, receive, send), produce())
        return bodies

    return asyncio.run(asyncio.wait_for(main(), 30))


def test_events_handed_over_together_go_out_in_one_body_and_lone_ones_at_once():
    ones = _stream_bodies(1, 5)
    assert ones == [f"data: {s}.0\n\n".encode() for s in range(5)] + [b""]
    threes = _stream_bodies(3, 4)
    assert threes == [b"".join(f"data: {s}.{k}\n\n".encode() for k in range(3)) for s in range(4)] + [b""]


def test_text_held_for_a_batch_goes_out_before_the_reader_waits_even_when_the_last_event_has_none():
    """The stream sends nothing for an event without text (half a character, a possible stop string): when such an
    event ends a batch, the batch's earlier text must still go out before the reader waits for the next."""
    async def main():
        engine = _Handles()
        job = Job(engine)
        job.submit([object()])
        bodies, seen_before_next = [], []

        async def chunks(gone):
            async for _, event in job.events(gone):
                if event.text:  # as stream_chunks: an event without text yields no chunk
                    yield event.text

        async def receive():
            await asyncio.Event().wait()

        async def send(message):
            if message["type"] == "http.response.body":
                bodies.append(message["body"])

        async def produce():
            engine.callbacks[0](_event("a"))
            engine.callbacks[0](_event(""))  # handed over with "a", yields nothing
            await asyncio.sleep(0.05)  # the reader has taken both and now waits
            seen_before_next.append(list(bodies))
            engine.callbacks[0](_event("b", last=True))

        await asyncio.gather(EventStream(job, chunks)({}, receive, send), produce())
        return bodies, seen_before_next[0]

    bodies, before = asyncio.run(asyncio.wait_for(main(), 30))
    assert before == [b"data: a\n\n"]
    assert bodies == [b"data: a\n\n", b"data: b\n\n", b""]


def test_a_finished_loop_is_not_kept_alive_by_its_waker():
    import gc
    import weakref

    async def main():
        loop = asyncio.get_running_loop()
        LoopWaker.of(loop)
        return weakref.ref(loop)

    ref = asyncio.run(main())
    gc.collect()
    assert ref() is None


class _Writer:
    """A ChunkWriter stand-in: records the bodies written past the ASGI send; `ready` toggles it."""

    def __init__(self, ready: bool = True):
        self.bodies, self.is_ready = [], ready

    def ready(self) -> bool:
        return self.is_ready

    def write(self, body: bytes) -> None:
        self.bodies.append(body)


def _plain(index: int, event: TokenEvent) -> str | None:
    """A route's plain(): a token without a finish is plain ("x" -> "x", "" -> nothing to send)."""
    return None if event.finish_reason is not None else event.text


def _fast_lane_stream(writer: _Writer | None, script, slow_send_s: float = 0.0) -> tuple[list, list]:
    """An EventStream over a job fed by `script(callbacks)` (an async producer) -> (the ASGI send's bodies in order
    as (how, body), the data the route's chunks() yielded). With a writer in the scope the fast lane is on."""
    async def main():
        engine = _Handles()
        job = Job(engine)
        job.submit([object()])
        sent, yielded = [], []

        async def chunks(gone):
            async for _, event in job.events(gone):
                if event.text:
                    yielded.append(event.text)
                    yield event.text

        async def receive():
            await asyncio.Event().wait()

        async def send(message):
            if message["type"] == "http.response.body":
                if slow_send_s:
                    await asyncio.sleep(slow_send_s)  # a send that suspends before it writes (a paused socket)
                sent.append(("send", message["body"]))

        if writer is not None:  # the writer's bodies land in the same record, in the order written
            writer.write = lambda body: sent.append(("fast", body))
        scope = {"extensions": {"gptedge.write_chunk": writer}} if writer is not None else {}
        await asyncio.gather(EventStream(job, chunks, _plain)(scope, receive, send), script(engine.callbacks[0]))
        return sent, yielded

    return asyncio.run(asyncio.wait_for(main(), 30))


async def _tokens_then_finish(callback):
    for k in range(5):
        await asyncio.sleep(0.01)  # the reader is parked each time
        callback(_event(f"t{k}"))
    await asyncio.sleep(0.01)
    callback(_event(""))  # plain, nothing to send
    await asyncio.sleep(0.01)
    callback(_event("end", last=True))


def test_the_fast_lane_writes_plain_tokens_itself_and_the_reader_sends_the_rest_in_order():
    sent, yielded = _fast_lane_stream(_Writer(), _tokens_then_finish)
    assert sent == [("fast", f"data: t{k}\n\n".encode()) for k in range(5)] + [("send", b"data: end\n\n"),
                                                                                ("send", b"")]
    assert yielded == ["end"]  # the reader saw only the finish


def test_without_a_ready_writer_or_any_writer_the_reader_sends_every_token():
    expected = [("send", f"data: t{k}\n\n".encode()) for k in range(5)] + [("send", b"data: end\n\n"), ("send", b"")]
    for writer in (_Writer(ready=False), None):
        sent, yielded = _fast_lane_stream(writer, _tokens_then_finish)
        assert sent == expected
        assert yielded == [f"t{k}" for k in range(5)] + ["end"]


def test_a_burst_mixing_plain_and_finishing_events_keeps_its_order():
    async def burst(callback):
        await asyncio.sleep(0.01)
        for k in range(3):
            callback(_event(f"a{k}"))
        callback(_event("stop", last=True))  # not plain: it and what follows go to the reader

    sent, yielded = _fast_lane_stream(_Writer(), burst)
    body = b"".join(b for _, b in sent)
    assert body == b"".join(f"data: {t}\n\n".encode() for t in ("a0", "a1", "a2", "stop"))
    assert sent[0] == ("fast", b"data: a0\n\ndata: a1\n\ndata: a2\n\n")  # the plain lead in one write
    assert yielded == ["stop"]


def test_the_fast_lane_never_overtakes_a_send_still_waiting_to_write():
    """The reader's send suspends before writing (the socket paused, then draining) while plain tokens arrive and
    the socket turns writable: they must not be written ahead of the body that send is holding."""
    writer = _Writer(ready=False)  # paused: the first tokens go through the reader

    async def script(callback):
        callback(_event("first"))
        callback(_event(""))  # handed over with "first": its chunk is held, sent as the reader is about to wait
        await asyncio.sleep(0.005)  # now that send waits (draining) and the socket is writable again
        writer.is_ready = True
        for k in range(3):
            callback(_event(f"n{k}"))
            await asyncio.sleep(0.01)
        callback(_event("end", last=True))

    sent, _ = _fast_lane_stream(writer, script, slow_send_s=0.02)
    body = b"".join(b for _, b in sent)
    assert body == b"".join(f"data: {t}\n\n".encode() for t in ("first", "n0", "n1", "n2", "end"))


def test_a_conversation_counts_its_messages_not_only_their_content():
    """Chat rendering runs on the event loop only for a short conversation: many empty messages are long work."""
    from gptedge.serve.off_loop import INLINE_TEXT_CHARS, message_chars, text_chars

    short = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert message_chars(short) <= INLINE_TEXT_CHARS
    assert message_chars([{"role": "user", "content": ""}] * 100) > INLINE_TEXT_CHARS  # no content, still long
    assert message_chars([{"role": "user", "content": "x" * 2000}]) > INLINE_TEXT_CHARS
    assert text_chars(["ab", [1, 2, 3], "c"]) == 3  # token-id prompts cost no tokenizer work


def test_launch_after_a_chain_ended_on_its_own_leaves_its_steps_to_take():
    """can_launch saw a chain running; before launch it ended by itself (a row at the cache's end): launch must
    neither raise nor start a second chain over the steps not taken."""
    import numpy as np

    from gptedge.runtime.serving.step_ahead import StepAhead

    class NoRoomAfterOne:
        steps = 0

        def step_picked(self, seqs, tokens, needs):
            self.steps += 1
            return np.asarray(tokens) + 1, None

        def room_to_step(self):
            return False  # the chain ends after each step

        def remove(self, seq):
            pass

    pool = NoRoomAfterOne()
    ahead = StepAhead(pool, min_rows=1, depth=2)
    ahead.launch([3], np.array([5]))
    deadline = __import__("time").monotonic() + 10
    while ahead._active and __import__("time").monotonic() < deadline:
        threading.Event().wait(0.001)
    ahead.launch([3], np.array([5]))  # the engine's late launch: a no-op
    assert ahead.take() == {3: 6} and pool.steps == 1
    assert ahead.take() is None and not ahead.out
    ahead.close()
