"""Export sources that are Hugging Face Hub ids (`gpt2`, `openai-community/gpt2-medium`), not local dirs.

A SOURCE that is an existing directory is used as it is: a local dir always wins over a Hub id of the
same spelling. Anything else that looks like a repo id is fetched with `huggingface_hub.snapshot_download`,
restricted to what export reads (config, weights, tokenizer files): GPT-2's repos also hold TensorFlow,
Flax, Rust and ONNX copies of the weights, several times the size of the one we need.

The environment is read at call time, not when huggingface_hub was imported (transformers may have
imported it long before): HF_HOME / HF_HUB_CACHE say where the cache is, HF_HUB_OFFLINE=1 forbids the
network (the cached snapshot is used or the export fails in one line), HF_TOKEN authenticates
gated or private repos (without it, huggingface_hub's stored login is used).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from gptedge.runtime.errors import CheckpointError

from .checkpoint import WEIGHT_FILES

log = logging.getLogger(__name__)

# What export_checkpoint reads: config, one weights file, the tokenizer in any of its layouts (tokenizer.json; GPT-2's
# two files; a SentencePiece tokenizer.model alone), its special tokens and chat template.
CONFIG_PATTERNS = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                   "vocab.json", "merges.txt", "encoder.json", "vocab.bpe", "tokenizer.model",
                   "special_tokens_map.json", "chat_template.jinja"]
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
TRUE = {"1", "on", "yes", "true"}


def looks_like_repo_id(source: str) -> bool:
    return bool(REPO_ID.match(source)) and ".." not in source and not source.endswith((".", "-"))


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in TRUE


def hub_cache_dir() -> Path:
    """huggingface_hub's own rule: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "huggingface"
    return Path(home).expanduser() / "hub"


def resolve_source(source: str | Path, revision: str | None = None) -> tuple[Path, dict]:
    """SOURCE -> (a local checkpoint dir, what the manifest records about the Hub: {} for a local dir)."""
    path = Path(source)
    if path.is_dir():
        if revision:
            raise CheckpointError(f"{source} is a local directory: --revision applies to Hugging Face Hub ids only")
        return path, {}
    if not looks_like_repo_id(str(source)):
        raise CheckpointError(f"{source}: no such directory, and not a Hugging Face Hub id")
    snapshot = _snapshot(str(source), revision, CONFIG_PATTERNS + [WEIGHT_FILES[0]])
    if not any((snapshot / name).is_file() for name in WEIGHT_FILES):  # an older repo: .bin only
        snapshot = _snapshot(str(source), revision, CONFIG_PATTERNS + list(WEIGHT_FILES[1:]))
    log.info("%s resolved to %s", source, snapshot)
    return snapshot, {"hub_repo_id": str(source), "hub_revision": snapshot.name}


def _snapshot(repo_id: str, revision: str | None, patterns: list[str]) -> Path:
    """One snapshot_download; every failure becomes one line naming the id and the offline setting."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import (GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError,
                                            RevisionNotFoundError)
    except ImportError:
        raise CheckpointError(f"{repo_id}: not a local directory, and fetching it from the Hugging Face Hub needs "
                              "huggingface_hub (pip install 'gptedge[export]')") from None
    offline, cache = hub_offline(), hub_cache_dir()
    at = f"@{revision}" if revision else ""
    try:
        return Path(snapshot_download(repo_id, revision=revision, cache_dir=cache, local_files_only=offline,
                                      allow_patterns=patterns, token=os.environ.get("HF_TOKEN") or None))
    except GatedRepoError:
        raise CheckpointError(f"{repo_id}: a gated repo on the Hugging Face Hub; accept its terms and set "
                              "HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise CheckpointError(f"{repo_id}: no such repo on the Hugging Face Hub (or it is private: set "
                              "HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise CheckpointError(f"{repo_id}: no revision {revision!r} on the Hugging Face Hub") from None
    except LocalEntryNotFoundError:
        why = ("HF_HUB_OFFLINE=1 forbids downloading it" if offline
               else "the Hugging Face Hub cannot be reached (HF_HUB_OFFLINE is not set)")
        raise CheckpointError(f"{repo_id}{at}: not in the Hugging Face cache {cache} and {why}") from None
    except OSError as e:  # network errors are OSErrors (requests / httpx), as are cache permission errors
        raise CheckpointError(f"{repo_id}{at}: cannot fetch from the Hugging Face Hub with HF_HUB_OFFLINE "
                              f"{'=1' if offline else 'unset'} ({type(e).__name__}: "
                              f"{str(e).splitlines()[0][:150]})") from None
