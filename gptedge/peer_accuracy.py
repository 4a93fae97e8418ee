"""Peer engines for `gptedge compare --peers`: each quantizes the same HF checkpoint its own way and is
scored by compare on the same windows, against the same fp32 reference, as gptedge's rows.

| peer | recipes (default) | a window's logits | greedy continuation (timed as gptedge's) |
|---|---|---|---|
| ctranslate2 | int8, int8_float32 (converter quantization = compute type) | `Generator.forward_batch` | `Generator.generate_tokens` |
| llama.cpp | Q8_0, Q4_K_M, Q4_0 (gptedge.peer_llama_cpp) | `Llama(logits_all=True).eval` | `Llama.generate`, temp 0 |
| optimum | dynamic int8 (ORTQuantizer avx512_vnni, per channel) | `ORTModelForCausalLM(...)` | `.generate` with a streamer |

The conversions and loaders are bench's (gptedge.peers). Peers always run on CPU. A peer whose package is
not installed is skipped with a one-line install hint; one that fails on the checkpoint is a PeerError.
On CPU, CTranslate2 runs "int8" as int8_float32: when two recipes resolve to one compute type they
are one row, labelled with both names.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from gptedge.peer_llama_cpp import converter_hint, converter_source, llama_cpp_scorer
from gptedge.peers import OPTIMUM_INT8, ctranslate2_model_dir, load_optimum, optimum_model_dir, with_hf_tokenizer
from gptedge.runtime.compare import Greedy, PeerInfo, Scorer, decode_rate, timed_greedy
from gptedge.runtime.errors import GptEdgeError, InvalidArgumentError, PeerError, install_hint

log = logging.getLogger(__name__)

COMPARE_PEERS = ("ctranslate2", "llama.cpp", "optimum")
RECIPES = {"ctranslate2": ("int8", "int8_float32"), "llama.cpp": ("Q8_0", "Q4_K_M", "Q4_0"), "optimum": ("int8",)}
NEEDS = {  # modules each peer imports (conversion included), in the order they are checked
    "ctranslate2": ("ctranslate2", "torch", "transformers"),
    "llama.cpp": ("llama_cpp", "torch", "transformers"),
    "optimum": ("torch", "optimum.onnxruntime"),
}


def unavailable(peer: str) -> str | None:
    """Why `peer` cannot run here (one line with the install hint), or None."""
    for module in NEEDS[peer]:
        try:
            importlib.import_module(module)
        except ImportError:
            return f"{module} is not installed: {install_hint(peer if module == NEEDS[peer][0] else 'peers')}"
    if peer == "llama.cpp" and converter_source() is None:
        return converter_hint()
    return None


class CTranslate2Scorer:
    def __init__(self, model_dir: Path, quantization: str, threads: int, id_to_token: Callable[[int], str],
                 vocab_size: int, context_length: int):
        import ctranslate2

        self.generator = ctranslate2.Generator(str(model_dir), device="cpu", compute_type=quantization,
                                               intra_threads=threads)
        self.id_to_token = id_to_token
        self.vocab_size, self.context_length = vocab_size, context_length
        self.compute_type = self.generator.compute_type  # what it resolved to on this CPU
        self.info = PeerInfo(f"ctranslate2 {quantization}", f"ctranslate2 {ctranslate2.__version__}",
                             "fp32" if quantization == "float32" else "int8", f"CTranslate2 {self.compute_type}",
                             (model_dir / "model.bin").stat().st_size)

    def logits(self, ids: np.ndarray) -> np.ndarray:
        return np.asarray(self.generator.forward_batch([ids.tolist()]), dtype=np.float32)[0]  # (L, V)

    def greedy(self, prompt: list[int], max_new_tokens: int, eos_id: int | None) -> Greedy:
        steps = self.generator.generate_tokens([self.id_to_token(i) for i in prompt], max_length=max_new_tokens,
                                               sampling_topk=1, end_token=None if eos_id is None else [eos_id])

        def ids():  # generate_tokens stops on eos without yielding it; gptedge's ids keep it (greedy agreement)
            n = 0
            for step in steps:
                n += 1
                yield step.token_id
            if eos_id is not None and n < max_new_tokens:
                yield eos_id

        return timed_greedy(ids(), max_new_tokens, eos_id)


class OptimumScorer:
    def __init__(self, model_dir: Path, int8: bool, threads: int, vocab_size: int, context_length: int):
        from importlib.metadata import version

        self.model = load_optimum(model_dir, threads)
        self.vocab_size, self.context_length = vocab_size, context_length
        size = sum(f.stat().st_size for f in model_dir.iterdir() if f.suffix in (".onnx", ".data") or f.name.endswith(".onnx_data"))
        self.info = PeerInfo("optimum int8" if int8 else "optimum fp32", f"optimum-onnx {version('optimum-onnx')}",
                             "int8" if int8 else "fp32", "Optimum " + (OPTIMUM_INT8 if int8 else "fp32"), size)

    def logits(self, ids: np.ndarray) -> np.ndarray:
        import torch

        x = torch.from_numpy(ids)[None]  # (1, L)
        with torch.inference_mode():
            return self.model(input_ids=x, attention_mask=torch.ones_like(x)).logits[0].float().numpy()

    def greedy(self, prompt: list[int], max_new_tokens: int, eos_id: int | None) -> Greedy:
        import torch

        streamer = _TimedStreamer()
        x = torch.tensor([prompt])
        extra = {} if eos_id is None else {"eos_token_id": eos_id, "pad_token_id": eos_id}
        with torch.inference_mode():
            self.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens, do_sample=False,
                                streamer=streamer, **extra)
        return Greedy(streamer.ids, decode_rate(len(streamer.ids), streamer.times[0], streamer.times[-1]))


class _TimedStreamer:
    """transformers' streamer protocol: put() gets the prompt once, then each new token as it is chosen."""

    def __init__(self):
        self.ids: list[int] = []
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.times.append(time.perf_counter())
        self.ids.extend(int(t) for t in value.reshape(-1).tolist())

    def end(self) -> None:
        pass


def build_scorer(peer: str, recipe: str, source: Path, work: Path, threads: int, id_to_token: Callable[[int], str],
                 vocab_size: int, context_length: int) -> Scorer:
    if peer == "ctranslate2":
        return CTranslate2Scorer(ctranslate2_model_dir(source, recipe, work), recipe, threads, id_to_token, vocab_size,
                                 context_length)
    if peer == "optimum":
        int8 = recipe == "int8"
        return OptimumScorer(optimum_model_dir(source, int8, work), int8, threads, vocab_size, context_length)
    if peer == "llama.cpp":
        return llama_cpp_scorer(source, recipe, work, threads, vocab_size, context_length)
    raise ValueError(f"unknown peer {peer!r}: choose from {', '.join(COMPARE_PEERS)}")


def _merge_same_compute_type(scorers: list, scorer) -> bool:
    """A CTranslate2 recipe that resolved to a compute type already loaded: relabel that row, keep one."""
    for i, other in enumerate(scorers):
        if isinstance(other, CTranslate2Scorer) and other.compute_type == getattr(scorer, "compute_type", None):
            other.info = dataclasses.replace(other.info, name=f"{other.info.name} (= {scorer.info.name.split()[-1]})")
            return True
    return False


@contextmanager
def open_peers(peers: list[str], source: Path, model_dir: Path, threads: int, recipes: dict | None = None,
               notify: Callable[[str], None] | None = None) -> Iterator[tuple[list[Scorer], list[str]]]:
    """-> (scorers, skipped): each installed peer's recipes (default RECIPES) built from `source` in a
    temporary work dir that lives as long as the block; `skipped` has one line per peer not installed.
    model_dir: the reference dir (its tokenizer.json stands in for a checkpoint that has only GPT-2's
    original tokenizer files, and gives CTranslate2 its token strings)."""
    from gptedge.runtime.manifest import read_manifest
    from gptedge.runtime.tokenizer import load_tokenizer

    recipes = recipes or RECIPES
    config = json.loads((Path(source) / "config.json").read_text(encoding="utf-8"))
    vocab_size = config["vocab_size"]
    context_length = config.get("n_positions") or config.get("n_ctx")
    ref_vocab = read_manifest(model_dir).shape.vocab_size
    if vocab_size != ref_vocab:
        raise InvalidArgumentError(f"{source} has a vocabulary of {vocab_size} tokens, the reference {model_dir} "
                                   f"{ref_vocab}: the peers must quantize the reference's own checkpoint")
    tokenizer = load_tokenizer(Path(model_dir))
    scorers: list[Scorer] = []
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gptedge-peers-") as tmp:
        work = Path(tmp)
        hf_source = with_hf_tokenizer(Path(source), Path(model_dir), work)
        for peer in peers:
            reason = unavailable(peer)
            if reason:
                skipped.append(f"peer {peer} skipped: {reason}")
                continue
            for recipe in recipes[peer]:
                if notify:
                    notify(f"peer {peer} {recipe}: converting {source}")
                try:
                    scorer = build_scorer(peer, recipe, hf_source, work, threads, tokenizer.id_to_token, vocab_size,
                                          context_length)
                except GptEdgeError:
                    raise
                except Exception as e:  # noqa: BLE001 - a peer's own failure, reported in one line with its name
                    raise PeerError(f"peer {peer} {recipe} failed on {source}: {type(e).__name__}: {e}") from e
                if not _merge_same_compute_type(scorers, scorer):
                    scorers.append(scorer)
                log.info("peer %s ready: %s", scorer.info.name, scorer.info.engine)
        yield scorers, skipped
