"""`gptedge compare --peers`: each asked engine quantizes the same HF checkpoint its own way; compare scores
its recipes on the same windows, against the same fp32 reference, as gptedge's rows.

| peer | recipes (default) | a window's logits | greedy continuation (timed as gptedge's) |
|---|---|---|---|
| ctranslate2 | int8, int8_float32 (quantization = compute type) | `Generator.forward_batch` | `.generate_tokens` |
| llama.cpp | Q8_0, Q4_K_M, Q4_0 (peers/llama_cpp.py) | `Llama(logits_all=True).eval` | `Llama.generate`, temp 0 |
| optimum | dynamic int8 (ORTQuantizer avx512_vnni, per channel) | `ORTModelForCausalLM` | `.generate`, a streamer |

Peers always run on CPU. A peer whose package is not installed is skipped with a one-line install hint;
one that fails on the checkpoint is a PeerError. When two recipes of one peer resolve to one engine
configuration (CTranslate2 runs "int8" as int8_float32 on CPU) they are one row, labelled with both names.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from gptedge.runtime.errors import GptEdgeError, InvalidArgumentError, PeerError, install_hint
from gptedge.runtime.modeldir.manifest import read_manifest
from gptedge.runtime.modeldir.tokenizer import load_tokenizer

from . import engine_for
from .base import Scorer, ScoreJob, with_hf_tokenizer

log = logging.getLogger(__name__)


def unavailable(peer: str) -> str | None:
    """Why `peer` cannot run here (one line with the install hint), or None."""
    engine = engine_for(peer, "compare")
    for module in engine.needs:
        try:
            importlib.import_module(module)
        except ImportError:
            hint = install_hint(engine.install if module == engine.needs[0] else "peers")
            return f"{module} is not installed: {hint}"
    return engine.missing()


def _merge_same_configuration(ready: list[Scorer], scorer: Scorer) -> bool:
    """A recipe that resolved to an engine configuration this peer already loaded: relabel that row, keep one.
    `ready`: this peer's scorers so far."""
    for other in ready:
        if scorer.resolved is not None and other.resolved == scorer.resolved:
            other.info = dataclasses.replace(other.info, name=f"{other.info.name} (= {scorer.info.name.split()[-1]})")
            return True
    return False


@contextmanager
def open_peers(peers: list[str], source: Path, model_dir: Path, threads: int, recipes: dict | None = None,
               notify: Callable[[str], None] | None = None) -> Iterator[tuple[list[Scorer], list[str]]]:
    """-> (scorers, skipped): each installed peer's recipes (default: the engine's own) built from `source` in
    a temporary work dir that lives as long as the block; `skipped` has one line per peer not installed.
    model_dir: the reference dir (its tokenizer.json stands in for a checkpoint that has only GPT-2's
    original tokenizer files, and gives CTranslate2 its token strings)."""
    engines = {peer: engine_for(peer, "compare") for peer in peers}
    recipes = recipes or {}
    config = json.loads((Path(source) / "config.json").read_text(encoding="utf-8"))
    vocab_size = config["vocab_size"]
    ref_shape = read_manifest(model_dir).shape
    context_length, ref_vocab = ref_shape.context_length, ref_shape.vocab_size  # n_positions / max_position_embeddings
    if vocab_size != ref_vocab:
        raise InvalidArgumentError(f"{source} has a vocabulary of {vocab_size} tokens, the reference {model_dir} "
                                   f"{ref_vocab}: the peers must quantize the reference's own checkpoint")
    tokenizer = load_tokenizer(Path(model_dir))
    scorers: list[Scorer] = []
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gptedge-peers-") as tmp:
        work = Path(tmp)
        job = ScoreJob(with_hf_tokenizer(Path(source), Path(model_dir), work), work, threads, tokenizer.id_to_token,
                       vocab_size, context_length)
        for peer in peers:
            reason = unavailable(peer)
            if reason:
                skipped.append(f"peer {peer} skipped: {reason}")
                continue
            engine, ready = engines[peer], []
            for recipe in recipes.get(peer, engine.recipes):
                if notify:
                    notify(f"peer {peer} {recipe}: converting {source}")
                try:
                    scorer = engine.scorer(recipe, job)
                except GptEdgeError:
                    raise
                except Exception as e:  # noqa: BLE001 - a peer's own failure, reported in one line with its name
                    raise PeerError(f"peer {peer} {recipe} failed on {source}: {type(e).__name__}: {e}") from e
                if not _merge_same_configuration(ready, scorer):
                    ready.append(scorer)
                log.info("peer %s ready: %s", scorer.info.name, scorer.info.engine)
            scorers += ready
        yield scorers, skipped
