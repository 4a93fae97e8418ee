"""Turn a checkpoint's tokenizer files into one tokenizer.json (byte-level BPE, as GPT-2's).

Accepted: tokenizer.json as is; or vocab.json / encoder.json with merges.txt / vocab.bpe; or a SentencePiece
tokenizer.model alone (Llama 1 / 2-era checkpoints), converted as transformers converts it to its fast tokenizer.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from gptedge.runtime.errors import CheckpointError
from gptedge.runtime.modeldir.tokenizer import TOKENIZER_FILE

log = logging.getLogger(__name__)

VOCAB_FILES = ("vocab.json", "encoder.json")
SENTENCEPIECE_FILE = "tokenizer.model"
MERGES_FILES = ("merges.txt", "vocab.bpe")
ENDOFTEXT = "<|endoftext|>"


def byte_level_bpe(vocab: Path, merges: Path):
    """GPT-2's tokenizer from its two files: byte-level pre-tokenizer and decoder, no prefix space."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    try:
        tok = Tokenizer(models.BPE.from_file(str(vocab), str(merges)))
    except Exception as e:  # tokenizers raises a bare Exception on malformed files
        raise CheckpointError(f"{vocab.parent}: cannot read {vocab.name} / {merges.name} "
                              f"({str(e).splitlines()[0]})") from None
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    if tok.token_to_id(ENDOFTEXT) is not None:
        tok.add_special_tokens([AddedToken(ENDOFTEXT, special=True, normalized=False)])
    return tok


def sentencepiece_tokenizer(source: Path):
    """The tokenizers-library tokenizer transformers makes from the checkpoint's SentencePiece tokenizer.model (its
    slow class, named by tokenizer_config.json or config.json's model_type, converted to the fast one: byte fallback,
    Metaspace, the added special tokens). Needs transformers and sentencepiece (the export extra installs the
    latter; transformers is not in it: the test extra has it)."""
    try:
        from transformers import AutoTokenizer
        from transformers.utils import logging as transformers_logging

        quiet = transformers_logging.get_verbosity()
        transformers_logging.set_verbosity_error()  # its slow classes warn of their "legacy" mode on every load
        try:
            tok = AutoTokenizer.from_pretrained(str(source), use_fast=True)
        finally:
            transformers_logging.set_verbosity(quiet)
    except Exception as e:  # noqa: BLE001 - ImportError (no transformers / sentencepiece), or the class's own errors
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{source}: its SentencePiece {SENTENCEPIECE_FILE} could not be converted to "
                              f"{TOKENIZER_FILE} ({type(e).__name__}: {why[:160]}); transformers converts it with "
                              "sentencepiece installed (pip install transformers sentencepiece)") from None
    if not getattr(tok, "is_fast", False):
        raise CheckpointError(f"{source}: transformers has no fast tokenizer for its {SENTENCEPIECE_FILE} "
                              f"({type(tok).__name__}): save a {TOKENIZER_FILE} beside it")
    return tok.backend_tokenizer


def find_tokenizer_source(source: Path) -> tuple[Path, ...] | None:
    if (source / TOKENIZER_FILE).is_file():
        return (source / TOKENIZER_FILE,)
    vocab = next((source / n for n in VOCAB_FILES if (source / n).is_file()), None)
    merges = next((source / n for n in MERGES_FILES if (source / n).is_file()), None)
    if vocab and merges:
        return vocab, merges
    if (source / SENTENCEPIECE_FILE).is_file():
        return (source / SENTENCEPIECE_FILE,)
    return None


def write_tokenizer(source: Path, out_dir: Path, vocab_size: int) -> bool:
    """Write out_dir/tokenizer.json from the source's files; False when the source has none."""
    found = find_tokenizer_source(source)
    if found is None:
        log.warning("%s has no tokenizer files: the model will take token ids only", source)
        return False
    if found[0].name == SENTENCEPIECE_FILE:
        tok = sentencepiece_tokenizer(source)
        tok.save(str(out_dir / TOKENIZER_FILE))
        log.info("%s: %s converted to %s (as transformers converts it)", source, SENTENCEPIECE_FILE, TOKENIZER_FILE)
    elif len(found) == 1:
        from tokenizers import Tokenizer

        try:
            tok = Tokenizer.from_file(str(found[0]))
        except Exception as e:
            raise CheckpointError(f"{found[0]}: corrupt tokenizer ({str(e).splitlines()[0]})") from None
        shutil.copyfile(found[0], out_dir / TOKENIZER_FILE)
    else:
        tok = byte_level_bpe(*found)
        tok.save(str(out_dir / TOKENIZER_FILE))
    if tok.get_vocab_size() > vocab_size:
        raise CheckpointError(f"tokenizer has {tok.get_vocab_size()} tokens but the model's vocabulary is {vocab_size}")
    return True
