"""Incremental detokenization that never emits half a UTF-8 character, nor part of a stop string.

Byte-level BPE can split one character (an emoji, an accented letter) over several tokens;
decoding the tokens so far then ends in U+FFFD. We hold such a tail back until the next
token completes it. Likewise a tail that could be the start of a stop string is held back
until it is known not to be one, so streamed text never has to be taken back.

The stream is also where each token's place in the text is known (`last_offset`): the length of the text the
tokens before it decode to, an incomplete character left out. The server's logprobs report it as the
token's text_offset, so a request's text and its logprobs come from one decoding (docs/serving.md).

A byte-level BPE (GPT-2's, and Qwen2's, SmolLM2's and Pythia's) decodes ids by mapping each token's characters back
to bytes and the whole to UTF-8 (tokenizers' ByteLevel decoder): the stream keeps each token's bytes (token_bytes) and
an incremental UTF-8 decoder, so a push decodes one token's bytes instead of calling the tokenizer twice, which was
most of the serving engine's host time per token (~24 us a token, 36 % of it in push).

A tokenizer with byte fallback (`<0xE2>`-style tokens, Metaspace BPE) decodes a run of byte tokens as one: a later
byte that makes the run invalid UTF-8 turns the whole run, ASCII bytes included, into U+FFFD. The text of a
trailing run of byte tokens is therefore held back until a token that is not a byte ends the run.
"""

from __future__ import annotations

import codecs
import functools
import json
import re
from collections.abc import Callable, Sequence

from ..modeldir.tokenizer import decode

REPLACEMENT = "\ufffd"
BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")  # byte fallback's token for one raw byte


class TextStream:
    def __init__(self, tokenizer, stop_strings: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop_strings = tuple(s for s in stop_strings if s)
        self.ids: list[int] = []
        self.emitted = ""  # text already handed out; always a prefix of the final text
        self.stopped = False  # a stop string has appeared
        self.final_text: str | None = None
        self.last_offset = 0  # where the last pushed token's text starts in the text
        self._complete = 0  # length of the text so far without an incomplete character at its end
        # Incremental decoding (see _decoded): ids[:_clean] decode to _clean_text and end on a whole character;
        # ids[_window:_clean] (the previous clean stretch, the next token's left context) decode to _window_text.
        self._window = self._clean = 0
        self._clean_text = self._window_text = ""
        self._bytes = token_bytes(tokenizer)  # None: not a byte-level BPE; decoded through the window instead
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._text = ""  # the byte-level path's text so far, an incomplete character at its end held by _utf8

    def push(self, token_id: int) -> str:
        """Add one generated id; return the newly completed text (possibly empty)."""
        self.ids.append(token_id)
        text = self._decoded()
        self.last_offset, self._complete = self._complete, len(text.rstrip(REPLACEMENT))
        cut = self._stop_position(text)
        if cut is not None:
            self.stopped = True
            self.final_text = text[:cut]
            return self._emit(self.final_text)
        if text.endswith(REPLACEMENT):  # an incomplete character: wait for its remaining bytes
            return ""
        run = self._byte_run() if self._bytes is None else 0  # byte-level BPE: no byte-fallback tokens
        if run:  # the run may still turn to U+FFFD as a whole: only the text before it is settled
            settled = decode(self.tokenizer, self.ids[:-run])
            return self._emit(settled[: len(settled) - self._held_back(settled)])
        return self._emit(text[: len(text) - self._held_back(text)])

    def _decoded(self) -> str:
        """decode(ids), in time independent of the text's length: decoding every id again at every token made a
        stream's cost quadratic (at 64 streams of 128 tokens, 60 % of the serving engine's host time).

        The ids since the last clean point are decoded together with the stretch before it (its left context:
        a Metaspace tokenizer strips the first token's leading space, a byte-level one needs the bytes of a
        character split over tokens), and what the stretch alone decodes to is cut off the front. A clean point
        is a length whose text ends on a whole character, whose last token is no byte-fallback token (a later
        byte may turn a whole run of them into U+FFFD) and whose stretch has text of its own. Should the window's
        text not start with the stretch's, the whole is decoded (tests/generation/test_text_stream_incremental.py
        checks every prefix against decode() on each kind of tokenizer)."""
        if self._bytes is not None:  # one token's bytes; an incomplete character decodes as decode() gives it, U+FFFD
            self._text += self._utf8.decode(self._bytes(int(self.ids[-1])))
            held = self._utf8.getstate()[0]  # bytes of a character not complete yet (or not yet known invalid)
            return self._text + held.decode("utf-8", "replace") if held else self._text
        whole = decode(self.tokenizer, self.ids[self._window:])
        if not whole.startswith(self._window_text):
            return decode(self.tokenizer, self.ids)
        text = self._clean_text + whole[len(self._window_text):]
        last = self.tokenizer.id_to_token(self.ids[-1])
        if not text.endswith(REPLACEMENT) and last is not None and not BYTE_TOKEN.fullmatch(last):
            stretch = decode(self.tokenizer, self.ids[self._clean:])
            # A stretch with no text (a special token, skipped) is no context: the next token would decode as the
            # text's first (Metaspace's leading space stripped). The window then keeps the stretch before it.
            if stretch:
                self._window_text = stretch
                self._window, self._clean, self._clean_text = self._clean, len(self.ids), text
        return text

    def flush(self) -> str:
        """At the end of generation: whatever is left, an incomplete tail included."""
        if self.final_text is None:
            self.final_text = decode(self.tokenizer, self.ids)
        return self._emit(self.final_text)

    @property
    def text(self) -> str:
        return self.final_text if self.final_text is not None else decode(self.tokenizer, self.ids)

    def _byte_run(self) -> int:
        """How many of the last ids are byte-fallback tokens (or ids the tokenizer lacks, which decode to nothing
        and so do not end a run: a model's vocabulary may be padded past its tokenizer's); 0 if the last is neither."""
        n = 0
        while n < len(self.ids):
            token = self.tokenizer.id_to_token(self.ids[-1 - n])
            if token is not None and not BYTE_TOKEN.fullmatch(token):
                break
            n += 1
        return n

    def _stop_position(self, text: str) -> int | None:
        hits = [i for i in (text.find(s) for s in self.stop_strings) if i >= 0]
        return min(hits) if hits else None

    def _held_back(self, text: str) -> int:
        """Length of the longest tail of `text` that is a proper prefix of some stop string."""
        longest = 0
        for s in self.stop_strings:
            for n in range(min(len(s) - 1, len(text)), longest, -1):
                if text.endswith(s[:n]):
                    longest = n
                    break
        return longest

    def _emit(self, text: str) -> str:
        if len(text) <= len(self.emitted) or not text.startswith(self.emitted):
            return ""
        piece = text[len(self.emitted):]
        self.emitted = text
        return piece


def token_text(tokenizer, token_id: int) -> str:
    """One token's own text (special tokens written out): what a logprobs entry names it by."""
    return tokenizer.decode([token_id], skip_special_tokens=False)


def token_offsets(tokenizer, ids: Sequence[int]) -> list[int]:
    """Where each token's text starts in decode(ids), as TextStream.last_offset gives it token by token: the
    length of the text of the tokens before it, an incomplete character at its end left out."""
    prefixes = tokenizer.decode_batch([list(ids[:i]) for i in range(len(ids))], skip_special_tokens=True)
    return [len(p.rstrip(REPLACEMENT)) for p in prefixes]


@functools.lru_cache(maxsize=1)
def _char_bytes() -> dict[str, int]:
    """GPT-2's byte-level alphabet reversed: the character that stands for each byte -> the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), 256)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_NOT_BYTE_LEVEL = object()


def token_bytes(tokenizer) -> Callable[[int], bytes] | None:
    """id -> the bytes it contributes to decode(ids) when the tokenizer's decoder is tokenizers' ByteLevel (a special
    token nothing: decode skips them; an id the tokenizer lacks nothing; a token with a character outside the byte
    alphabet, an added token's text, its UTF-8, as the decoder does); None for any other tokenizer. Made once per
    tokenizer and kept on it."""
    cached = getattr(tokenizer, "_gptedge_token_bytes", None)
    if cached is not None:
        return None if cached is _NOT_BYTE_LEVEL else cached
    try:
        spec = json.loads(tokenizer.to_str())
    except (AttributeError, TypeError, ValueError):  # not a tokenizers.Tokenizer (a test's stand-in): the general path
        return None
    made = _NOT_BYTE_LEVEL
    if (spec.get("decoder") or {}).get("type") == "ByteLevel":
        special = frozenset(a["id"] for a in spec.get("added_tokens", ()) if a.get("special"))
        alphabet, to_token = _char_bytes(), tokenizer.id_to_token

        @functools.lru_cache(maxsize=None)
        def made(token_id: int) -> bytes:
            token = None if token_id in special else to_token(token_id)
            if token is None:
                return b""
            try:
                return bytes(alphabet[c] for c in token)
            except KeyError:
                return token.encode()

    try:
        tokenizer._gptedge_token_bytes = made
    except AttributeError:  # an object that takes no attributes: made again for the next stream
        pass
    return None if made is _NOT_BYTE_LEVEL else made
