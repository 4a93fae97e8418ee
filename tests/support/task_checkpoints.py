"""Tiny seeded fine-tuned checkpoints in transformers' own classes (the task heads' parity oracle), saved with the
GPT-2 tokenizer plus the GPT paper's three special tokens, declared as transformers declares them."""

from __future__ import annotations

import json
from pathlib import Path

from .checkpoints import GPT2_TOKENIZER, GPT2_VOCAB

SPECIAL = {"bos_token": "<start>", "sep_token": "<delim>", "cls_token": "<extract>"}  # start, delimiter, extract
VOCAB = GPT2_VOCAB + len(SPECIAL)  # the special tokens take ids 50257..50259
LABELS = {0: "contradiction", 1: "neutral", 2: "entailment"}
# exported dir name -> the task it is exported for (from the checkpoint of the same name; gpt2-sim from gpt2-seq)
EXPORTS = {"gpt2-seq": "entailment", "gpt2-sim": "similarity", "openai-seq": "classification",
           "gpt2-mc": "multiple-choice", "openai-mc": "multiple-choice"}
SHAPE = dict(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4)
# head name -> (transformers class, config class, config fields beyond SHAPE)
HEADS = {
    "gpt2-seq": ("GPT2ForSequenceClassification", "GPT2Config",
                 dict(num_labels=3, pad_token_id=50256, id2label=LABELS, initializer_range=0.2)),
    "openai-seq": ("OpenAIGPTForSequenceClassification", "OpenAIGPTConfig",
                   dict(num_labels=3, pad_token_id=0, id2label=LABELS, initializer_range=0.2)),
    "gpt2-mc": ("GPT2DoubleHeadsModel", "GPT2Config", dict(summary_activation="tanh", initializer_range=0.2)),
    "openai-mc": ("OpenAIGPTDoubleHeadsModel", "OpenAIGPTConfig", dict(initializer_range=0.2)),
}


def write_tokenizer(out: Path, declare: bool = True) -> None:
    from tokenizers import AddedToken

    from gptedge.export.tokenizer_files import byte_level_bpe

    tok = byte_level_bpe(GPT2_TOKENIZER / "encoder.json", GPT2_TOKENIZER / "vocab.bpe")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL.values()])
    tok.save(str(out / "tokenizer.json"))
    if declare:
        (out / "tokenizer_config.json").write_text(json.dumps(SPECIAL), encoding="utf-8")


def make_checkpoint(head: str, out: Path, seed: int = 0, declare: bool = True, **overrides) -> Path:
    """transformers' own model of `head` (seeded), saved in HF layout with the tokenizer."""
    import torch
    import transformers

    model_cls, config_cls, fields = HEADS[head]
    torch.manual_seed(seed)
    config = getattr(transformers, config_cls)(**{**SHAPE, **fields, **overrides})
    getattr(transformers, model_cls)(config).eval().save_pretrained(out)
    write_tokenizer(out, declare)
    return out


def hf_model(checkpoint: Path):
    import transformers

    config = json.loads((checkpoint / "config.json").read_text())
    return getattr(transformers, config["architectures"][0]).from_pretrained(checkpoint).eval()


def build_checkpoints(root: Path) -> dict[str, Path]:
    return {head: make_checkpoint(head, root / head, seed=i) for i, head in enumerate(HEADS)}


def build_dirs(root: Path, checkpoints: dict[str, Path]) -> dict[str, Path]:
    from gptedge.export.head_export import export_task

    for name, task in EXPORTS.items():
        export_task(checkpoints["gpt2-seq" if name == "gpt2-sim" else name], root / name, task=task)
    return {name: root / name for name in EXPORTS}
