"""Turn a checkpoint's tokenizer files into one tokenizer.json (byte-level BPE, as GPT-2's).

Accepted: tokenizer.json as is; or vocab.json / encoder.json with merges.txt / vocab.bpe.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from gptedge.runtime.errors import CheckpointError
from gptedge.runtime.modeldir.tokenizer import TOKENIZER_FILE

log = logging.getLogger(__name__)

VOCAB_FILES = ("vocab.json", "encoder.json")
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


def find_tokenizer_source(source: Path) -> tuple[Path, ...] | None:
    if (source / TOKENIZER_FILE).is_file():
        return (source / TOKENIZER_FILE,)
    vocab = next((source / n for n in VOCAB_FILES if (source / n).is_file()), None)
    merges = next((source / n for n in MERGES_FILES if (source / n).is_file()), None)
    if vocab and merges:
        return vocab, merges
    return None


def write_tokenizer(source: Path, out_dir: Path, vocab_size: int) -> bool:
    """Write out_dir/tokenizer.json from the source's files; False when the source has none."""
    found = find_tokenizer_source(source)
    if found is None:
        log.warning("%s has no tokenizer files: the model will take token ids only", source)
        return False
    if len(found) == 1:
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
