"""Tokenizer work on the event loop or off it (the routes' prompts, echoes and chat renders)."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool

# Text up to this many characters in all is tokenized on the event loop: encoding it costs the loop less than a hop to
# the thread pool does (anyio's task, capacity limiter, queue and two wake-ups: ~0.1-0.2 ms of the loop a request,
# which at 64 clients delays every newcomer's first token). Longer text goes off the loop.
INLINE_TEXT_CHARS = 1024


async def off_loop_unless_small(chars: int, fn, *args):
    """fn(*args): on the event loop when `chars` characters of text are at most INLINE_TEXT_CHARS, else in the
    thread pool."""
    return fn(*args) if chars <= INLINE_TEXT_CHARS else await run_in_threadpool(fn, *args)


def text_chars(texts) -> int:
    """Characters of the str items (token-id prompts cost no tokenizer work)."""
    return sum(len(t) for t in texts if isinstance(t, str))
