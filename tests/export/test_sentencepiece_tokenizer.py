"""A checkpoint whose tokenizer is a SentencePiece tokenizer.model alone (no tokenizer.json: Llama 1 / 2-era and
Gemma-style repos): export converts it as transformers converts it to its fast tokenizer, and the dir encodes as
transformers' slow tokenizer (sentencepiece underneath) does for a model with identity normalization, as Llama's
and Gemma's are (with nmt_nfkc or collapsed whitespace the fast conversion itself differs from sentencepiece), bos
first as it adds it."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from gptedge import runtime
from gptedge.cli import main
from gptedge.export import tokenizer_files

from ..support.checkpoints import ROOT

TEXTS = ["It was a truth universally acknowledged", "  two spaces, digits 1811 and 42", "café — naïve ☃ 🙂",
         "<start_of_turn>user\nHello<end_of_turn>", "tab\there"]


@pytest.fixture(scope="module")
def sp_checkpoint(tmp_path_factory):
    """A tiny Gemma with a 320-piece SentencePiece BPE (byte fallback, Gemma's turn markers) trained on the calibration
    text, and no tokenizer.json."""
    import sentencepiece  # the export extra installs it
    import torch
    from transformers import GemmaConfig, GemmaForCausalLM, GemmaTokenizer

    out = tmp_path_factory.mktemp("sp-gemma")
    text = out / "train.txt"
    text.write_text((ROOT / "samples" / "calibration" / "emma_ch1-4.txt").read_text(encoding="utf-8")[:60000])
    sentencepiece.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(out / "tokenizer"), vocab_size=320, model_type="bpe", byte_fallback=True,
        pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>",
        unk_piece="<unk>", user_defined_symbols=["<start_of_turn>", "<end_of_turn>"],
        add_dummy_prefix=False, normalization_rule_name="identity", remove_extra_whitespaces=False,
        minloglevel=2)
    for leftover in (text, out / "tokenizer.vocab"):
        leftover.unlink()
    vocab = len(GemmaTokenizer(str(out / "tokenizer.model")))  # the pieces and the special tokens the class adds
    config = GemmaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
                         pad_token_id=0, eos_token_id=1, bos_token_id=2)
    torch.manual_seed(0)
    GemmaForCausalLM(config).save_pretrained(out)
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GemmaTokenizer"}))
    return out


def test_a_sentencepiece_only_checkpoint_exports_with_its_tokenizer(sp_checkpoint, tmp_path):
    from transformers import GemmaTokenizer

    result = CliRunner().invoke(main, ["export", str(sp_checkpoint), "-o", str(tmp_path / "m")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "m" / "tokenizer.json").is_file() and not (sp_checkpoint / "tokenizer.json").exists()
    model = runtime.load(tmp_path / "m", device="cpu")
    slow = GemmaTokenizer(str(sp_checkpoint / "tokenizer.model"))  # sentencepiece itself, the ground truth
    assert model.manifest.add_bos and model.manifest.bos_id == 2
    for text in TEXTS:
        assert model.encode_prompt(text) == slow(text)["input_ids"], text
        if "_of_turn>" not in text:  # decode drops special tokens, as transformers' skip_special_tokens
            assert model.decode(model.encode(text)) == text
    assert model.generate("It was", max_new_tokens=4, greedy=True).ids  # the whole chain runs on text


def test_a_tokenizer_model_that_cannot_be_converted_is_one_line(sp_checkpoint, tmp_path, monkeypatch):
    """Without sentencepiece transformers cannot read tokenizer.model: export stops in one line saying so, and writes
    nothing (it used to export an ids-only dir with a warning)."""
    source = tmp_path / "ck"
    shutil.copytree(sp_checkpoint, source)

    def no_sentencepiece(*args, **kwargs):
        raise ImportError("requires the SentencePiece library but it was not found in your environment")

    import transformers
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", no_sentencepiece)
    result = CliRunner().invoke(main, ["export", str(source), "-o", str(tmp_path / "m")])
    assert result.exit_code != 0
    line = result.output.strip()
    assert "\n" not in line and "tokenizer.model could not be converted to tokenizer.json" in line
    assert "pip install transformers sentencepiece" in line and not (tmp_path / "m").exists()
    assert tokenizer_files.find_tokenizer_source(source) == (source / "tokenizer.model",)
