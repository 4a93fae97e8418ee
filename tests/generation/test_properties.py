"""Property-based tests (hypothesis) of the pure parts: sampling parameters and filters, token ids,
stop strings, and UTF-8 streaming (any split of the bytes streams to the text a whole decode gives)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gptedge.runtime.errors import InvalidArgumentError
from gptedge.runtime.generation.sampling import SamplingParams, select_token, softmax, top_k_filter, top_p_filter
from gptedge.runtime.generation.text_stream import TextStream
from gptedge.runtime.modeldir.tokenizer import decode, encode, load_tokenizer

from ..support.checkpoints import ROOT

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# --- sampling parameters ----------------------------------------------------------------------------------

# Booleans are left out: SamplingParams takes True / False for numbers (bool is an int); the Python API's
# type checks are tests/generation/test_api_errors.py's.
anything = st.one_of(st.none(), st.integers(-5, 5), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=3))


def _valid(temperature, top_k, top_p, repetition_penalty, seed) -> bool:
    number = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)  # noqa: E731 - a one-line local helper
    integer = lambda x: isinstance(x, int) and not isinstance(x, bool)  # noqa: E731 - a one-line local helper
    return (number(temperature) and math.isfinite(temperature) and temperature >= 0
            and integer(top_k) and top_k >= 0
            and number(top_p) and 0 < top_p <= 1
            and number(repetition_penalty) and math.isfinite(repetition_penalty) and repetition_penalty > 0
            and (seed is None or (integer(seed) and seed >= 0)))


@SETTINGS
@given(anything, anything, anything, anything, anything)
def test_sampling_params_accept_exactly_the_documented_ranges(temperature, top_k, top_p, repetition_penalty, seed):
    args = dict(temperature=temperature, top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty, seed=seed)
    if _valid(**args):
        SamplingParams(**args)
    else:
        with pytest.raises(InvalidArgumentError):  # never a TypeError or a silent default
            SamplingParams(**args)


logits_rows = st.lists(st.floats(-30, 30, allow_nan=False), min_size=1, max_size=40).map(np.array)


@SETTINGS
@given(logits_rows, st.integers(0, 50))
def test_top_k_keeps_the_k_largest(logits, k):
    kept = np.isfinite(top_k_filter(logits, k))
    if k == 0 or k >= len(logits):
        assert kept.all()
    else:
        kth = np.sort(logits)[-k]
        assert kept.sum() >= k and (kept == (logits >= kth)).all()  # ties at the k-th value all stay


@SETTINGS
@given(logits_rows, st.floats(1e-6, 1.0))
def test_top_p_keeps_the_smallest_nucleus(logits, p):
    kept = np.isfinite(top_p_filter(logits, p))
    probs = softmax(logits.astype(np.float64))
    assert kept.any() and kept[np.argmax(logits)]
    assert probs[kept].sum() >= min(p, 1.0) - 1e-9  # enough mass...
    if p < 1.0:  # ...and nothing kept that was not needed: dropping the least likely kept token falls short
        least = probs[kept].min()
        assert probs[kept].sum() - least < p + 1e-9


@SETTINGS
@given(logits_rows, st.integers(0, 10), st.floats(0.05, 1.0), st.floats(0.0, 3.0), st.floats(0.5, 2.0),
       st.integers(0, 2**32 - 1), st.lists(st.integers(0, 39), max_size=5))
def test_select_token_stays_in_the_filtered_set_and_is_reproducible(logits, k, p, temperature, penalty, seed, seen):
    seen = [s for s in seen if s < len(logits)]
    params = SamplingParams(temperature=temperature, top_k=k, top_p=p, repetition_penalty=penalty, seed=seed)
    pick = lambda: select_token(logits.astype(np.float32), params, np.random.default_rng(seed), seen)  # noqa: E731 - a one-line local helper
    token = pick()
    assert 0 <= token < len(logits) and token == pick()
    if params.is_greedy:
        from gptedge.runtime.generation.sampling import apply_repetition_penalty

        adjusted = apply_repetition_penalty(logits.astype(np.float32).astype(np.float64), seen, penalty)
        assert adjusted[token] == adjusted.max()
    elif k:
        from gptedge.runtime.generation.sampling import apply_repetition_penalty

        adjusted = apply_repetition_penalty(logits.astype(np.float32).astype(np.float64), seen, penalty)
        assert adjusted[token] >= np.sort(adjusted)[-min(k, len(logits))]


# --- token ids, stop strings and UTF-8 streaming ----------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(ROOT / "samples" / "sample-model")


@pytest.fixture(scope="module")
def byte_ids(tokenizer) -> list[int]:
    """The id of each single byte's token (GPT-2's byte-to-unicode table: every byte is a token)."""
    table = {}
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    extra = 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    ids = [tokenizer.token_to_id(table[b]) for b in range(256)]
    assert None not in ids
    return ids


texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60)


def stream_all(tokenizer, ids, stops=()) -> tuple[str, TextStream]:
    stream = TextStream(tokenizer, stops)
    pieces = []
    for i in ids:
        pieces.append(stream.push(i))
        if stream.stopped:
            break
    pieces.append(stream.flush())
    return "".join(pieces), stream


@pytest.mark.slow  # 150 texts through the real GPT-2 tokenizer, both ways
@SETTINGS
@given(texts)
def test_ids_round_trip(tokenizer, text):
    ids = encode(tokenizer, text)
    assert all(isinstance(i, int) and 0 <= i < tokenizer.get_vocab_size() for i in ids)
    assert decode(tokenizer, ids) == text


@SETTINGS
@given(texts, st.data())
def test_any_byte_split_streams_to_the_whole_decode(tokenizer, byte_ids, text, data):
    """The text's bytes cut anywhere (one token per piece, pieces of any length encoded as bytes) stream
    to exactly the text, and no piece ever holds half a character."""
    assume("\ufffd" not in text)  # a text's own U+FFFD would read as half a character below
    raw = text.encode("utf-8")
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(raw) - 1)), max_size=len(raw))))
    ids = []
    for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True):
        piece = raw[a:b]
        try:  # a piece that is whole UTF-8 goes through the BPE; one that splits a character, byte by byte
            ids += encode(tokenizer, piece.decode("utf-8"))
        except UnicodeDecodeError:
            ids += [byte_ids[x] for x in piece]
    stream = TextStream(tokenizer)
    pieces = [stream.push(i) for i in ids] + [stream.flush()]
    assert "".join(pieces) == text == decode(tokenizer, ids)
    assert all("\ufffd" not in p for p in pieces)


@SETTINGS
@given(st.lists(st.integers(0, 50256), max_size=30))
def test_any_ids_stream_to_their_decode(tokenizer, ids):
    streamed, _ = stream_all(tokenizer, ids)
    assert streamed == decode(tokenizer, ids)


@SETTINGS
@given(texts, st.lists(st.text(min_size=1, max_size=4, alphabet="ab é\n"), max_size=3), st.data())
def test_stop_strings_end_the_text_before_the_first_one(tokenizer, byte_ids, text, stops, data):
    """Streamed text never holds a stop string and is never taken back: generation stops at the first
    token after which the text holds a stop string, and the text ends where the earliest one starts
    (or it is all of it), however the text's bytes arrive."""
    raw = text.encode("utf-8")
    ids = [byte_ids[x] for x in raw] if data.draw(st.booleans()) else encode(tokenizer, text)
    streamed, stream = stream_all(tokenizer, ids, stops)
    want, stopped = decode(tokenizer, ids), False
    for k in range(1, len(ids) + 1):  # the oracle: every prefix decoded whole, as tokens arrive
        so_far = decode(tokenizer, ids[:k])
        hits = [i for i in (so_far.find(s) for s in stops) if i >= 0]
        if hits:  # e.g. stops " " and "\n \n" in "\n \n": " " completes first, so the text is "\n"
            want, stopped = so_far[:min(hits)], True
            break
    assert streamed == stream.text == want
    assert not any(s in streamed for s in stops)
    assert stream.stopped == stopped


def test_tiny_temperature_is_greedy_not_nan():
    """Found by the property above: a subnormal temperature overflowed the scaled logits to inf and
    softmax to NaN (ValueError from rng.choice)."""
    params = SamplingParams(temperature=2.2250738585e-313)
    assert select_token(np.array([1.0, 3.0, 2.0], dtype=np.float32), params, np.random.default_rng(0), []) == 1
