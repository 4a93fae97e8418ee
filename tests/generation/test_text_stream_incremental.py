"""TextStream decodes incrementally (a byte-level BPE's token bytes through an incremental UTF-8 decoder; any other
tokenizer through a window since the last clean point), not every id again per token: on each kind of tokenizer the
project ships (GPT-2's byte-level BPE, Llama's Metaspace BPE with byte fallback), and on GPT-2's through the window
too, every push gives the pieces, offsets and stops that decoding every id again gives."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer

from gptedge.export.tokenizer_files import byte_level_bpe
from gptedge.runtime.generation.text_stream import TextStream
from gptedge.runtime.modeldir.tokenizer import decode, encode

from ..support.checkpoints import GPT2_TOKENIZER, ROOT
from ..support.lineage_checkpoints import write_tokenizer


class WindowStream(TextStream):
    """The general path (a window since the last clean point) on any tokenizer, a byte-level one too."""

    def __init__(self, *args):
        super().__init__(*args)
        self._bytes = None


class WholeDecodeStream(TextStream):
    """The reference: decode() of every id at every token (what TextStream did before it kept a window)."""

    def _decoded(self) -> str:
        return decode(self.tokenizer, self.ids)


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory) -> dict[str, Tokenizer]:
    out = tmp_path_factory.mktemp("metaspace")
    write_tokenizer(out)
    return {"gpt2": Tokenizer.from_file(str(ROOT / "samples" / "sample-model" / "tokenizer.json")),
            # the original GPT-2 vocabulary: tokens that hold whole characters and the first bytes of a split one
            "gpt2-50k": byte_level_bpe(GPT2_TOKENIZER / "encoder.json", GPT2_TOKENIZER / "vocab.bpe"),
            "metaspace": Tokenizer.from_file(str(out / "tokenizer.json"))}


def _sequences(tok: Tokenizer, seed: int) -> list[list[int]]:
    """Random ids (byte tokens, split characters and special tokens among them) and real text with emoji."""
    rng = np.random.default_rng(seed)
    vocab = tok.get_vocab_size()
    text = "Héllo wörld, it is 😀 the end… 日本語 and\n\nthe rest 🎉🎉"
    real = encode(tok, text)
    out = [real, real[::-1], list(rng.integers(0, vocab, 200)), real[:5] + [vocab + 3] + real[5:]]  # an id it lacks
    out += [list(rng.integers(0, min(vocab, 300), 120)) for _ in range(4)]  # dense in byte and special tokens
    out += [[int(i) for i in rng.permutation(real)] for _ in range(3)]
    return out


@pytest.mark.parametrize("kind, stream", [("gpt2", TextStream), ("gpt2", WindowStream), ("gpt2-50k", TextStream),
                                          ("metaspace", TextStream)],
                         ids=["gpt2-bytes", "gpt2-window", "gpt2-50k-bytes", "metaspace-window"])
@pytest.mark.parametrize("stops", [(), (" the", "rest")])
def test_every_push_equals_decoding_every_id_again(tokenizers, kind, stream, stops):
    tok = tokenizers[kind]
    for seed, ids in enumerate(_sequences(tok, 0)):
        got, want = stream(tok, stops), WholeDecodeStream(tok, stops)
        for i, t in enumerate(ids):
            assert got.push(int(t)) == want.push(int(t)), (kind, seed, i)
            assert (got.last_offset, got.stopped, got._complete) == (want.last_offset, want.stopped,
                                                                      want._complete), (kind, seed, i)
            if got.stopped:
                break
        assert got.flush() == want.flush() and got.text == want.text
        assert got.stopped or got.text == decode(tok, got.ids)  # a stop cuts the text at the stop string


def test_the_window_stays_short_however_long_the_stream(tokenizers):
    """The point of it: a clean point is reached again and again, so each push decodes a few ids, not all."""
    tok = tokenizers["gpt2"]
    stream = WindowStream(tok)
    for t in encode(tok, "the quick brown fox jumps over the lazy dog " * 40):
        stream.push(t)
        assert len(stream.ids) - stream._window <= 4


@pytest.mark.parametrize("kind", ["gpt2", "metaspace"])
def test_a_special_token_between_words_keeps_the_space_after_it(tokenizers, kind):
    """A special token decodes to nothing (skipped): as the only context of the next word, Metaspace's decoder would
    strip that word's leading space ("Helloworld"); the stream must give what decoding every id gives."""
    tok = tokenizers[kind]
    special = tok.token_to_id("</s>" if kind == "metaspace" else "<|endoftext|>")
    ids = encode(tok, "hello") + [special] + encode(tok, " world") + [special, special] + encode(tok, " it is")
    got, want = TextStream(tok), WholeDecodeStream(tok)
    pieces = [(got.push(t), want.push(t)) for t in ids]
    assert [g for g, _ in pieces] == [w for _, w in pieces]
    assert got.flush() == want.flush() and got.text == decode(tok, ids)


def test_a_byte_level_bpe_streams_its_token_bytes_and_no_other_does(tokenizers):
    """GPT-2's decoder is ByteLevel: each push decodes one token's bytes (no tokenizer call); Metaspace's is not."""
    gpt2, meta = TextStream(tokenizers["gpt2"]), TextStream(tokenizers["metaspace"])
    assert gpt2._bytes is not None and meta._bytes is None
    special = tokenizers["gpt2"].token_to_id("<|endoftext|>")
    assert gpt2._bytes(special) == b"" and gpt2._bytes(encode(tokenizers["gpt2"], " the")[0]) == b" the"
    calls = []
    real = tokenizers["gpt2"]

    class Counting:  # the same tokenizer, its decode calls counted
        def __getattr__(self, name):
            return getattr(real, name)

        def decode(self, *a, **k):
            calls.append(1)
            return real.decode(*a, **k)

    stream = TextStream(Counting())  # token_bytes reads the spec through to_str: a byte-level BPE
    for t in encode(real, "Héllo wörld 😀 and the rest"):
        stream.push(t)
    assert calls == []


def test_an_added_token_outside_the_byte_alphabet_streams_as_its_own_text(tokenizers):
    """An added (not special) token's text is no byte-level string (a real space, say): the decoder writes it as it
    is, and so must the stream."""
    tok = Tokenizer.from_str(tokenizers["gpt2"].to_str())
    tok.add_tokens(["<tool call>"])  # a space, not the alphabet's Ġ
    added = tok.token_to_id("<tool call>")
    ids = encode(tok, "Hello") + [added] + encode(tok, " wörld")
    got, want = TextStream(tok), WholeDecodeStream(tok)
    assert got._bytes is not None and got._bytes(added) == b"<tool call>"
    assert [got.push(t) for t in ids] == [want.push(t) for t in ids]
    assert got.flush() == want.flush() and got.text == decode(tok, ids)
