"""Whether a checkpoint's tokenizer starts every text with its beginning-of-sequence token (`add_bos`).

Llama-style checkpoints say so in tokenizer_config.json (`add_bos_token`), or only through tokenizer.json's
post-processor (a TemplateProcessing whose single-sequence template starts with a special token), which
transformers' fast tokenizer applies. gptedge's runtime encodes text without the post-processor (GPT-2's
adds nothing) and prepends bos_id itself where the manifest says add_bos, so both spellings end as one flag.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from gptedge.runtime.modeldir.tokenizer import TOKENIZER_FILE

log = logging.getLogger(__name__)

TOKENIZER_CONFIG = "tokenizer_config.json"


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _template_adds_bos(processor: object) -> bool:
    if not isinstance(processor, dict):
        return False
    if processor.get("type") == "Sequence":  # newer tokenizers nest ByteLevel + TemplateProcessing
        return any(_template_adds_bos(p) for p in processor.get("processors") or ())
    single = processor.get("single") if processor.get("type") == "TemplateProcessing" else None
    return bool(single) and isinstance(single[0], dict) and "SpecialToken" in single[0]


def adds_bos(source: Path | None, written: Path | None = None) -> bool:
    """add_bos_token from tokenizer_config.json where it says, else whether tokenizer.json's post-processor
    puts a special token first (the source's, or `written`, the one export made where the source has none: a
    SentencePiece tokenizer.model converted); False without either (GPT-2)."""
    if source is None:
        return False
    said = _read(source / TOKENIZER_CONFIG).get("add_bos_token")
    if isinstance(said, bool):
        return said
    tokenizer = source / TOKENIZER_FILE
    if not tokenizer.is_file() and written is not None:
        tokenizer = written
    found = _template_adds_bos(_read(tokenizer).get("post_processor"))
    if found:
        log.info("%s: its post-processor starts each text with a special token: add_bos", source / TOKENIZER_FILE)
    return found
