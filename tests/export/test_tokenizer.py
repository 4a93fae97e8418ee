"""Tokenizer files -> tokenizer.json, with the original GPT-2 files."""

from __future__ import annotations

import pytest

from gptedge.export.tokenizer_files import byte_level_bpe, write_tokenizer
from gptedge.runtime.modeldir.tokenizer import TOKENIZER_FILE, decode, encode, has_tokenizer, load_tokenizer

from ..support.checkpoints import GPT2_TOKENIZER, copy_gpt2_tokenizer


@pytest.fixture(scope="module")
def gpt2_tokenizer():
    return byte_level_bpe(GPT2_TOKENIZER / "encoder.json", GPT2_TOKENIZER / "vocab.bpe")


def test_hello_world_ids(gpt2_tokenizer):
    assert encode(gpt2_tokenizer, "Hello world") == [15496, 995]
    assert gpt2_tokenizer.get_vocab_size() == 50257
    assert gpt2_tokenizer.token_to_id("<|endoftext|>") == 50256


@pytest.mark.parametrize("text", [
    "", " ", "   leading and  double  spaces", "tabs\tand\nnewlines\n\n\r\n", "naïve café — déjà vu",
    "emoji 🦙🚀 and 👩‍👩‍👧 family", "日本語のテキスト", "mixed: Ωμέγα, русский, العربية", "trailing space ",
])
def test_round_trip(gpt2_tokenizer, text):
    assert decode(gpt2_tokenizer, encode(gpt2_tokenizer, text)) == text


def test_tokenizer_json_written_from_vocab_and_merges(tmp_path, gpt2_tokenizer):
    src = tmp_path / "src"
    src.mkdir()
    copy_gpt2_tokenizer(src)
    (tmp_path / "out").mkdir()
    assert write_tokenizer(src, tmp_path / "out", vocab_size=50257)
    tok = load_tokenizer(tmp_path / "out")
    text = "It is a truth universally acknowledged 🦙"
    assert encode(tok, text) == encode(gpt2_tokenizer, text)


def test_tokenizer_json_copied_as_is(tmp_path, gpt2_tokenizer):
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir(), out.mkdir()
    gpt2_tokenizer.save(str(src / "tokenizer.json"))
    assert write_tokenizer(src, out, vocab_size=50257)
    assert (out / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()


def test_tokenizer_larger_than_vocabulary_is_refused(tmp_path):
    from gptedge.runtime.errors import CheckpointError

    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir(), out.mkdir()
    copy_gpt2_tokenizer(src)
    with pytest.raises(CheckpointError, match="50257 tokens but the model's vocabulary is 1000"):
        write_tokenizer(src, out, vocab_size=1000)


def test_has_tokenizer_is_the_one_test_of_a_tokenizer_file(tmp_path):
    """load, generate's with_text default, beam texts, the engine's text stream, the file records and GenAI's readiness
    all ask has_tokenizer: a file named tokenizer.json, not a folder of that name."""
    assert not has_tokenizer(tmp_path)
    (tmp_path / TOKENIZER_FILE).mkdir()
    assert not has_tokenizer(str(tmp_path))
    (tmp_path / TOKENIZER_FILE).rmdir()
    (tmp_path / TOKENIZER_FILE).write_text("{}")
    assert has_tokenizer(tmp_path) and has_tokenizer(str(tmp_path))
