"""A loaded model directory: manifest + one InferenceSession + its graph variant + tokenizer.

Thread safety: a LoadedModel holds no per-call state. Every call makes its own cache (and, on
kv_buffer graphs, its own IO binding), and ONNX Runtime lets several threads run one session at
once, so concurrent generate/stream/forward calls run concurrently and each gets exactly what it
would get alone; they share the session's intra-op thread pool. The tokenizer is loaded once,
under a lock, on first use.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from .checks.graph_check import check_graph, manifest_from_hf_dir
from .checks.integrity import open_checked_session
from .errors import InvalidArgumentError, ModelDirError
from .generation.arguments import check_bool, check_ids, check_options, check_stop, check_text
from .generation.beam_search import BeamOptions, BeamResult, beam_search
from .generation.generation import Generation, run_generation
from .generation.generation_options import PREFILL_CHUNK, is_count
from .generation.sampling import SamplingParams
from .graphs.graph_variant import GraphVariant, variant_for
from .graphs.cuda_graph import decode_graph_bytes
from .graphs.heap_trim import trim_heap
from .graphs.session import SessionConfig, import_onnxruntime, make_session
from .modeldir.manifest import MANIFEST_NAME, Manifest, read_manifest
from .modeldir.tasks import article
from .modeldir.tokenizer import decode, encode, has_tokenizer, load_tokenizer

log = logging.getLogger(__name__)

SAMPLING_OPTIONS = tuple(f.name for f in dataclasses.fields(SamplingParams))


class GenerationStream:
    """What `stream()` returns: iterate it for text pieces; `.result` is the Generation once done."""

    def __init__(self, pieces) -> None:
        self._pieces = pieces
        self.result: Generation | None = None

    def __iter__(self) -> Iterator[str]:
        while True:
            try:
                _, piece = next(self._pieces)
            except StopIteration as done:
                self.result = done.value[0]
                return
            yield piece


class LoadedModel:
    def __init__(self, model_dir: Path, manifest: Manifest, session, variant: GraphVariant, device: str,
                 load_s: float):
        self.model_dir = model_dir
        self.manifest = manifest
        self.session = session
        self.variant = variant
        self.device = device
        self.load_s = load_s
        self._tokenizer = None
        self._tokenizer_lock = threading.Lock()

    @property
    def providers(self) -> list[str]:
        return self.session.get_providers()

    # -- every position (validation, eval, the quantizer's checks) ---------------------------------------
    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray,
                past: Sequence[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        """One run -> (logits (B, S, V) float32, presents (B, nh, P + S, hs) as numpy)."""
        return self.variant.forward(input_ids, attention_mask, position_ids, past)

    def empty_past(self, batch: int) -> list[np.ndarray]:
        return self.variant.empty_past(batch)

    # -- text ----------------------------------------------------------------------------------------
    @property
    def has_tokenizer(self) -> bool:
        """Whether this dir holds a tokenizer: without one, text in or out is refused and generation gives ids."""
        return has_tokenizer(self.model_dir)

    @property
    def tokenizer(self):
        with self._tokenizer_lock:
            if self._tokenizer is None:
                self._tokenizer = load_tokenizer(self.model_dir)
        return self._tokenizer

    def encode(self, text: str) -> list[int]:
        return encode(self.tokenizer, check_text(text, "the text to encode"))

    def encode_prompt(self, text: str) -> list[int]:
        """A prompt's ids as the checkpoint's tokenizer makes them: bos_id first where the manifest says
        add_bos (Llama-style tokenizers; transformers' tokenizer adds it too), the text's ids alone otherwise."""
        ids = self.encode(text)
        m = self.manifest
        return [m.bos_id, *ids] if m.add_bos and m.bos_id is not None else ids

    def decode(self, ids: Sequence[int]) -> str:
        """Token ids (each inside the model's vocabulary) -> text."""
        return decode(self.tokenizer, check_ids(ids, self.manifest.shape.vocab_size))

    # -- generation ----------------------------------------------------------------------------------
    def _prompt_ids(self, prompt) -> list[int]:
        """A prompt as text or ids -> ids, every one inside the vocabulary."""
        if isinstance(prompt, str):
            return self.encode_prompt(check_text(prompt, "the prompt"))
        if isinstance(prompt, (bytes, bytearray)) or not isinstance(prompt, (Sequence, np.ndarray)):
            raise TypeError(f"a prompt is a str or a sequence of token ids, got {type(prompt).__name__}")
        return check_ids(prompt, self.manifest.shape.vocab_size)

    def _generation(self, prompts, max_new_tokens, stop, with_text, ignore_eos, prefill_chunk,
                    params: SamplingParams):
        stop = check_stop(stop)
        ignore_eos = check_bool(ignore_eos, "ignore_eos")
        prefill_chunk = check_prefill_chunk(prefill_chunk)
        ids = [self._prompt_ids(p) for p in prompts]
        m = self.manifest
        pad = m.pad_id if m.pad_id is not None else (m.eos_id or 0)
        eos = None if ignore_eos else (m.stop_ids or None)
        return run_generation(self.variant, ids, params, max_new_tokens, m.shape.context_length, eos, pad,
                              self.tokenizer if with_text else None, tuple(stop), prefill_chunk)

    def generate_batch(self, prompts: Sequence[str | Sequence[int]], max_new_tokens: int = 64,
                       stop: Sequence[str] = (), ignore_eos: bool = False, with_text: bool | None = None,
                       prefill_chunk: int | None = PREFILL_CHUNK, sampling: SamplingParams | None = None,
                       **fields) -> list[Generation]:
        """Prompts as text or ids, left-padded into one batch -> one Generation per prompt.

        ignore_eos: keep going past the end-of-text token (benchmarks); with_text: decode as we go
        (default: when the model dir has a tokenizer); prefill_chunk: prompt positions per prefill run
        (None: the whole prompt in one run); sampling: how to pick tokens, a SamplingParams, or its fields
        given as keywords (top_k=40, seed=0, ...)."""
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, (Sequence, np.ndarray)):
            raise TypeError(f"generate_batch() takes a list of prompts, got {type(prompts).__name__}")
        if with_text is None:
            with_text = any(isinstance(p, str) for p in prompts) or self.has_tokenizer
        with_text = check_bool(with_text, "with_text")
        gen = self._generation(prompts, max_new_tokens, stop, with_text, ignore_eos, prefill_chunk,
                               sampling_params(sampling, fields))
        while True:
            try:
                next(gen)
            except StopIteration as done:
                return done.value

    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = 64, stop: Sequence[str] = (),
                 **options) -> Generation:
        return self.generate_batch([prompt], max_new_tokens, stop, **options)[0]

    def beam_search(self, prompts: Sequence[str | Sequence[int]], max_new_tokens: int = 64, num_beams: int = 4,
                    length_penalty: float = 1.0, early_stopping: bool | str = False, num_return_sequences: int = 1,
                    prefill_chunk: int | None = PREFILL_CHUNK) -> list[BeamResult]:
        """Beam search over a left-padded batch, as transformers' generate(num_beams=...) -> one BeamResult
        per prompt: its best sequences and their scores (and texts, with a tokenizer)."""
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, (Sequence, np.ndarray)):
            raise TypeError(f"beam_search() takes a list of prompts, got {type(prompts).__name__}")
        options = BeamOptions(num_beams, length_penalty, early_stopping, num_return_sequences)
        prefill_chunk = check_prefill_chunk(prefill_chunk)
        ids = [self._prompt_ids(p) for p in prompts]
        m = self.manifest
        pad = m.pad_id if m.pad_id is not None else (m.eos_id or 0)
        results = beam_search(self.variant, ids, max_new_tokens, m.shape.context_length, m.stop_ids or None, pad,
                              options,
                              prefill_chunk)
        if self.has_tokenizer:
            for r in results:
                r.texts = [self.decode(s) for s in r.sequences]
        return results

    def stream(self, prompt: str | Sequence[int], max_new_tokens: int = 64, stop: Sequence[str] = (),
               prefill_chunk: int | None = PREFILL_CHUNK, sampling: SamplingParams | None = None,
               **fields) -> GenerationStream:
        """-> a handle: iterate it for text pieces as they complete; its `.result` is the Generation.
        sampling: a SamplingParams, or its fields as keywords."""
        return GenerationStream(self._generation([prompt], max_new_tokens, stop, True, False, prefill_chunk,
                                                 sampling_params(sampling, fields)))


def check_prefill_chunk(prefill_chunk) -> int | None:
    """prefill_chunk: None (the whole prompt in one run) or an integer >= 1 (a numpy one too; never True)."""
    if prefill_chunk is not None and not (is_count(prefill_chunk) and prefill_chunk >= 1):
        raise InvalidArgumentError(f"prefill_chunk must be an integer >= 1 or None, got {prefill_chunk!r}")
    return None if prefill_chunk is None else int(prefill_chunk)


def sampling_params(sampling: SamplingParams | None, fields: dict) -> SamplingParams:
    """The one SamplingParams of a call: passed whole, or built from its fields (never both)."""
    if sampling is None:
        check_options(fields, SAMPLING_OPTIONS, "generation")  # TypeError naming the options, not __init__'s
        return SamplingParams(**fields)
    if fields:
        raise TypeError(f"pass sampling=SamplingParams(...) or its fields ({', '.join(fields)}), not both")
    if not isinstance(sampling, SamplingParams):
        raise TypeError(f"sampling is a SamplingParams, got {type(sampling).__name__}")
    return sampling


def _enable_cuda_graphs(variant, manifest, graph: Path, device: str, config: SessionConfig) -> None:
    """A second session with CUDA graphs for decode steps, where the GPU, the graph and the config allow it;
    one that ONNX Runtime refuses leaves the ordinary path, with a log line."""
    if not (config.cuda_graph and manifest.wide_mask and getattr(variant, "kv_device", "cpu") == "cuda"):
        return
    try:
        model = decode_graph_bytes(graph.read_bytes())
        variant.enable_cuda_graphs(make_session(model, device=device, config=config, capture=True,
                                                external_data_dir=str(graph.parent)))
    except Exception as e:  # ONNX Runtime's own refusal (nodes it cannot capture): the ordinary path still works
        log.warning("CUDA graphs off for %s: %s", graph, str(e).splitlines()[0][:200])


def load(model_dir: str | Path, device: str = "auto", session: SessionConfig | None = None) -> LoadedModel:
    """Load a model directory on a device ("cpu", "cuda" or "auto") -> LoadedModel."""
    if not isinstance(model_dir, (str, os.PathLike)):
        raise TypeError(f"load() takes a model directory path, got {type(model_dir).__name__}")
    if session is not None and not isinstance(session, SessionConfig):
        raise TypeError(f"session is a SessionConfig (gptedge.runtime.SessionConfig(threads=2)), "
                        f"got {type(session).__name__}")
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelDirError(f"{model_dir}: no such model directory")
    started = time.perf_counter()
    imported = not (model_dir / MANIFEST_NAME).exists()
    manifest = manifest_from_hf_dir(model_dir) if imported else read_manifest(model_dir)
    if manifest.task is not None:
        raise ModelDirError(f"{model_dir} is {article(manifest.task.name)} {manifest.task.name} classifier "
                            f"({manifest.task.head} head), not a "
                            "language model: use gptedge classify / gptedge.runtime.load_classifier")
    ort_session, graph, tokenizer = open_checked_session(model_dir, manifest, imported, device, session)
    variant = variant_for(ort_session, import_onnxruntime(), manifest, device)
    variant.huge_pages = (session or SessionConfig()).huge_pages
    check_graph(variant, manifest, graph)
    _enable_cuda_graphs(variant, manifest, graph, device, session or SessionConfig())
    loaded = LoadedModel(model_dir, manifest, ort_session, variant, device, time.perf_counter() - started)
    loaded._tokenizer = tokenizer  # read once, for the checks
    if (session or SessionConfig()).trim_heap:
        trim_heap()  # what the load freed leaves the process (runtime/graphs/heap_trim.py)
    log.info("loaded %s (%s, %s graph) in %.2fs", model_dir, manifest.precision, manifest.graph, loaded.load_s)
    return loaded
