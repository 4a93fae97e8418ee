"""TextStream decodes incrementally (a window since the last clean point, not every id again per token): on each
kind of tokenizer the project ships (GPT-2's byte-level BPE, Llama's Metaspace BPE with byte fallback), every
push gives the pieces, offsets and stops that decoding every id again gives."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer

from gptedge.runtime.generation.text_stream import TextStream
from gptedge.runtime.modeldir.tokenizer import decode, encode

from ..support.checkpoints import ROOT
from ..support.lineage_checkpoints import write_tokenizer


class WholeDecodeStream(TextStream):
    """The reference: decode() of every id at every token (what TextStream did before it kept a window)."""

    def _decoded(self) -> str:
        return decode(self.tokenizer, self.ids)


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory) -> dict[str, Tokenizer]:
    out = tmp_path_factory.mktemp("metaspace")
    write_tokenizer(out)
    return {"gpt2": Tokenizer.from_file(str(ROOT / "samples" / "sample-model" / "tokenizer.json")),
            "metaspace": Tokenizer.from_file(str(out / "tokenizer.json"))}


def _sequences(tok: Tokenizer, seed: int) -> list[list[int]]:
    """Random ids (byte tokens, split characters and special tokens among them) and real text with emoji."""
    rng = np.random.default_rng(seed)
    vocab = tok.get_vocab_size()
    text = "Héllo wörld, it is 😀 the end… 日本語 and\n\nthe rest 🎉🎉"
    real = encode(tok, text)
    out = [real, real[::-1], list(rng.integers(0, vocab, 200))]
    out += [list(rng.integers(0, min(vocab, 300), 120)) for _ in range(4)]  # dense in byte and special tokens
    out += [[int(i) for i in rng.permutation(real)] for _ in range(3)]
    return out


@pytest.mark.parametrize("kind", ["gpt2", "metaspace"])
@pytest.mark.parametrize("stops", [(), (" the", "rest")])
def test_every_push_equals_decoding_every_id_again(tokenizers, kind, stops):
    tok = tokenizers[kind]
    for seed, ids in enumerate(_sequences(tok, 0)):
        got, want = TextStream(tok, stops), WholeDecodeStream(tok, stops)
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
    stream = TextStream(tok)
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
