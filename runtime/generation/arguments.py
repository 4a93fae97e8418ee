"""Checks on what callers of the Python API pass, so a wrong argument fails in one clear line.

A value of the wrong type raises TypeError, one of the right type but out of range raises
InvalidArgumentError (the CLI exits 2 on it); the message names the argument and what it got.
The library's own checks run before any work, never deep inside ONNX Runtime or tokenizers, whose
errors (OverflowError, "TextInputSequence must be str") do not say which argument was wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError
from .generation_options import EMPTY_STOP


def _got(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def check_text(text: Any, what: str) -> str:
    """A str that UTF-8 can encode: a lone surrogate ('\\ud800', from a bad JSON escape or surrogateescape)
    is refused with its position."""
    if not isinstance(text, str):
        raise TypeError(f"{what} must be a str, got {_got(text)}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidArgumentError(f"{what} holds a lone surrogate (U+{ord(text[e.start]):04X} at index {e.start}), "
                                   "which is not text; pass valid Unicode") from None
    return text


def check_stop(stop: Any) -> tuple[str, ...]:
    """Stop strings: a list or tuple of non-empty str (None: none). One rule with the server's `stop` field and
    `generate --stop`: an empty one is refused, not silently dropped."""
    if stop is None:
        return ()
    if isinstance(stop, (str, bytes)) or not isinstance(stop, (list, tuple)):
        raise TypeError(f"stop is a list of strings (stop=['\\n'], not stop='\\n'), got {_got(stop)}")
    stops = tuple(check_text(s, "a stop string") for s in stop)
    if "" in stops:
        raise InvalidArgumentError(EMPTY_STOP)
    return stops


def check_bool(value: Any, what: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what} must be True or False, got {_got(value)}")
    return bool(value)


def check_int(value: Any, what: str, minimum: int, maximum: int | None = None) -> int:
    """An int (not a bool, not a float, not a numeric string) in minimum..maximum."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an integer, got {_got(value)}")
    value = int(value)
    if value < minimum or (maximum is not None and value > maximum):
        span = f"{minimum}..{maximum}" if maximum is not None else f">= {minimum}"
        raise InvalidArgumentError(f"{what} must be {span}, got {value}")
    return value


def check_ids(ids: Any, vocab_size: int, what: str = "token ids") -> list[int]:
    """A sequence of ints, each in 0..vocab_size - 1 -> a list."""
    if isinstance(ids, (str, bytes, bytearray)) or not isinstance(ids, (Sequence, np.ndarray)):
        raise TypeError(f"{what} must be a sequence of integers, got {_got(ids)}")
    out = []
    for i in ids:
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"{what} are integers, got {_got(i)}")
        if not 0 <= i < vocab_size:
            raise InvalidArgumentError(f"token id {int(i)} is outside the vocabulary (0..{vocab_size - 1})")
        out.append(int(i))
    return out


def check_options(options: dict[str, Any], known: Sequence[str], where: str) -> None:
    """Keyword options a function passes on (sampling options): an unknown name is a TypeError naming them all."""
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise TypeError(f"{where} got an unknown option {unknown[0]!r}; its options are {', '.join(known)}")
