"""The model directory's tokenizer.json, through `tokenizers` (no transformers needed)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ModelDirError

TOKENIZER_FILE = "tokenizer.json"


def has_tokenizer(model_dir: str | Path) -> bool:
    """Whether the dir holds a tokenizer (an ids-only dir has none: it generates ids, never text)."""
    return (Path(model_dir) / TOKENIZER_FILE).is_file()


def load_tokenizer(model_dir: str | Path):
    from tokenizers import Tokenizer

    path = Path(model_dir) / TOKENIZER_FILE
    if not path.is_file():
        raise ModelDirError(f"{model_dir}: no {TOKENIZER_FILE} (needed to turn text into tokens)")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception for a malformed file
        raise ModelDirError(f"{path}: corrupt tokenizer ({str(e).splitlines()[0]})") from None


def encode(tokenizer, text: str) -> list[int]:
    """Text -> ids, no special tokens added (GPT-2 adds none)."""
    return tokenizer.encode(text, add_special_tokens=False).ids


def decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=True)
