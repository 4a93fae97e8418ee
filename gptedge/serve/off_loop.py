"""Tokenizer work on the event loop or off it (the routes' prompts, echoes and chat renders)."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool

# Text up to this many characters in all is tokenized on the event loop: encoding it costs the loop less than a hop to
# the thread pool does (anyio's task, capacity limiter, queue and two wake-ups: ~0.1-0.2 ms of the loop a request,
# which at 64 clients delays every newcomer's first token). Longer text goes off the loop.
INLINE_TEXT_CHARS = 1024
MESSAGE_CHARS = 64  # what one chat message counts for beside its content (its role and the template's text)


async def off_loop_unless_small(chars: int, fn, *args):
    """fn(*args): on the event loop when `chars` characters of text are at most INLINE_TEXT_CHARS, else in the
    thread pool."""
    return fn(*args) if chars <= INLINE_TEXT_CHARS else await run_in_threadpool(fn, *args)


def text_chars(texts) -> int:
    """Characters of the str items (token-id prompts cost no tokenizer work)."""
    return sum(len(t) for t in texts if isinstance(t, str))


def message_chars(messages) -> int:
    """What a chat conversation counts for: its contents' characters, and MESSAGE_CHARS a message (the template
    renders each one, content or not: 100k empty messages are no short prompt)."""
    return text_chars(str(m.get("content") or "") for m in messages) + MESSAGE_CHARS * len(messages)
