"""A loaded model directory: manifest + one InferenceSession + tokenizer, and the generation API."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from . import contract as C
from .errors import ModelDirError
from .generation import PREFILL_CHUNK, Generation, KVSpec, run_generation
from .kv_binding import FreshBuffers, KVBufferBinding
from .manifest import MANIFEST_NAME, Manifest, ModelShape, read_manifest
from .sampling import SamplingParams
from .session import import_onnxruntime, make_session
from .tokenizer import TOKENIZER_FILE, decode, encode, load_tokenizer

log = logging.getLogger(__name__)

_ORT_FLOAT = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


class LoadedModel:
    def __init__(self, model_dir: Path, manifest: Manifest, session, device: str, load_s: float):
        self.model_dir = model_dir
        self.manifest = manifest
        self.session = session
        self.device = device
        self.load_s = load_s
        self._tokenizer = None
        past_types = {i.name: i.type for i in session.get_inputs()}
        self._logits_dtype = _ORT_FLOAT.get({o.name: o.type for o in session.get_outputs()}[C.LOGITS], np.float32)
        self.kv_buffer = manifest.graph == C.GRAPH_KV_BUFFER
        self.kv = KVSpec(manifest.shape.n_layer, manifest.shape.n_head, manifest.shape.head_dim,
                         _ORT_FLOAT.get(past_types.get(C.past_key(0)), np.float32), buffer=self.kv_buffer)
        self._output_names = list(manifest.outputs)
        self._past_names = C.IONames(manifest.shape.n_layer).past_names
        self._present_names = C.IONames(manifest.shape.n_layer).present_names
        self._ort = import_onnxruntime()
        overridable = {i.name for i in session.get_overridable_initializers()}
        keep = np.array(1, dtype=np.int64)
        self._keep_last = self._ort.OrtValue.ortvalue_from_numpy(keep) if C.LOGITS_TO_KEEP in overridable else None
        self._kv_device = "cuda" if session.get_providers()[0] == "CUDAExecutionProvider" else "cpu"
        self.prefill_chunk: int | None = PREFILL_CHUNK  # prompt positions per prefill run; None: the whole prompt

    # -- graph I/O ---------------------------------------------------------------------------------
    @property
    def providers(self) -> list[str]:
        return self.session.get_providers()

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray,
                past: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        """One run of the graph -> (logits (B, S, V) float32, presents (B, nh, P + S, hs) as numpy)."""
        if self.kv_buffer:
            return self._forward_buffered(input_ids, attention_mask, position_ids, past)
        feeds = {C.INPUT_IDS: input_ids, C.ATTENTION_MASK: attention_mask, C.POSITION_IDS: position_ids}
        feeds.update(zip(self._past_names, past))
        logits, *presents = self.session.run(self._output_names, feeds)
        return logits.astype(np.float32, copy=False), presents

    def _forward_buffered(self, input_ids, attention_mask, position_ids, past):
        """forward() for kv_buffer graphs (validation, eval): grow the given past into buffers that hold
        the total, run in place, return copies cut to the total."""
        total = attention_mask.shape[1]
        buffers = []
        for p in past:
            p = np.asarray(p.numpy() if hasattr(p, "numpy") else p)
            if p.shape[2] < total:
                grown = np.zeros(p.shape[:2] + (total,) + p.shape[3:], p.dtype)
                grown[:, :, :p.shape[2]] = p
                p = grown
            buffers.append(p)
        # Each buffer bound as its own past and present: GroupQueryAttention writes the new positions in
        # place. The buffers are ONNX Runtime's own (one over numpy memory would die with the array).
        binding = self.session.io_binding()
        names = (C.INPUT_IDS, C.ATTENTION_MASK, C.POSITION_IDS, C.LOGITS_TO_KEEP)  # keep 0: every position
        inputs = [np.ascontiguousarray(a, dtype=np.int64) for a in (input_ids, attention_mask, position_ids, 0)]
        for name, array in zip(names, inputs):  # read in place by the run: `inputs` keeps them alive
            binding.bind_cpu_input(name, array)
        binding.bind_output(C.LOGITS, "cpu")
        owned = []
        for in_name, out_name, kv in zip(self._past_names, self._present_names, buffers):
            value = self._ort.OrtValue.ortvalue_from_shape_and_type(kv.shape, kv.dtype, self._kv_device, 0)
            value.update_inplace(kv)
            binding.bind_ortvalue_input(in_name, value)
            binding.bind_ortvalue_output(out_name, value)
            owned.append(value)
        self.session.run_with_iobinding(binding)
        logits = binding.get_outputs()[0].numpy().astype(np.float32, copy=False)
        return logits, [b.numpy()[:, :, :total] for b in owned]

    def _step(self, input_ids, attention_mask, position_ids, past):
        """One generation step -> (last-position logits (B, V), the past for the next step).

        Presents are never copied into numpy: they are fed back as the next step's past as they
        are. Graphs with logits_to_keep run the LM head on the last position only. On kv_buffer
        graphs the past is a KVBufferBinding made at the first step (from FreshBuffers) and reused."""
        if self.kv_buffer:
            if isinstance(past, FreshBuffers):
                shape = self.manifest.shape
                past = KVBufferBinding(self.session, self._ort, shape.n_layer,
                                       (past.batch, shape.n_head, past.max_length, shape.head_dim), self.kv.dtype,
                                       (past.batch, 1, shape.vocab_size), self._logits_dtype, self._kv_device)
            return past.step(input_ids, attention_mask, position_ids), past
        value = self._ort.OrtValue.ortvalue_from_numpy
        feeds = {C.INPUT_IDS: value(input_ids), C.ATTENTION_MASK: value(attention_mask),
                 C.POSITION_IDS: value(position_ids)}
        if self._keep_last is not None:
            feeds[C.LOGITS_TO_KEEP] = self._keep_last
        for name, kv in zip(self._past_names, past):
            feeds[name] = value(kv) if isinstance(kv, np.ndarray) else kv
        logits, *presents = self.session.run_with_ort_values(self._output_names, feeds)
        return logits.numpy()[:, -1, :].astype(np.float32, copy=False), presents  # (B, V)

    # -- text ----------------------------------------------------------------------------------------
    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.model_dir)
        return self._tokenizer

    def encode(self, text: str) -> list[int]:
        return encode(self.tokenizer, text)

    def decode(self, ids: Sequence[int]) -> str:
        return decode(self.tokenizer, list(ids))

    # -- generation ----------------------------------------------------------------------------------
    def _generation(self, prompts, max_new_tokens, stop, with_text, ignore_eos=False, **sampling):
        params = SamplingParams(**sampling)
        ids = [self.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        pad = self.manifest.pad_id if self.manifest.pad_id is not None else (self.manifest.eos_id or 0)
        eos = None if ignore_eos else self.manifest.eos_id
        # GroupQueryAttention on CPU takes a multi-position run over a non-empty past for batch 1 only
        chunk = None if self.kv_buffer and len(ids) > 1 else self.prefill_chunk
        return run_generation(self._step, self.kv, ids, params, max_new_tokens, self.manifest.shape.context_length,
                              eos, pad, self.tokenizer if with_text else None, stop, chunk)

    def generate_batch(self, prompts: Sequence[str | Sequence[int]], max_new_tokens: int = 64,
                       stop: Sequence[str] = (), ignore_eos: bool = False, with_text: bool | None = None,
                       **sampling) -> list[Generation]:
        """Prompts as text or ids, left-padded into one batch -> one Generation per prompt.

        ignore_eos: keep going past the end-of-text token (benchmarks); with_text: decode as we go
        (default: when the model dir has a tokenizer)."""
        if with_text is None:
            with_text = any(isinstance(p, str) for p in prompts) or (self.model_dir / TOKENIZER_FILE).is_file()
        gen = self._generation(prompts, max_new_tokens, stop, with_text, ignore_eos, **sampling)
        while True:
            try:
                next(gen)
            except StopIteration as done:
                return done.value

    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = 64, stop: Sequence[str] = (),
                 **sampling) -> Generation:
        return self.generate_batch([prompt], max_new_tokens, stop, **sampling)[0]

    def stream(self, prompt: str | Sequence[int], max_new_tokens: int = 64, stop: Sequence[str] = (),
               **sampling) -> Iterator[str]:
        """Yields text pieces as they complete; the Generation is left in `self.last_generation`."""
        gen = self._generation([prompt], max_new_tokens, stop, True, **sampling)
        while True:
            try:
                _, piece = next(gen)
            except StopIteration as done:
                self.last_generation = done.value[0]
                return
            yield piece


def load(model_dir: str | Path, device: str = "auto", threads: int | None = None) -> LoadedModel:
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelDirError(f"{model_dir}: no such model directory")
    started = time.perf_counter()
    if (model_dir / MANIFEST_NAME).is_file():
        manifest = read_manifest(model_dir)
    else:
        manifest = manifest_from_hf_dir(model_dir)
    model_path = model_dir / manifest.model_file
    if not model_path.is_file():
        raise ModelDirError(f"{model_dir}: no {manifest.model_file}")
    try:
        session = make_session(str(model_path), device=device, threads=threads)
    except Exception as e:
        if type(e).__module__.startswith("gptedge"):
            raise
        raise ModelDirError(f"{model_path}: ONNX Runtime cannot load it ({str(e).splitlines()[0][:200]})") from None
    check_graph_io(session, manifest, model_path)
    loaded = LoadedModel(model_dir, manifest, session, device, time.perf_counter() - started)
    log.info("loaded %s (%s, %s graph) in %.2fs", model_dir, manifest.precision, manifest.graph, loaded.load_s)
    return loaded


def check_graph_io(session, manifest: Manifest, model_path: Path) -> None:
    """The manifest and the graph must agree on every input and output name."""
    graph_in = [i.name for i in session.get_inputs()]
    graph_out = [o.name for o in session.get_outputs()]
    for kind, declared, actual in (("input", manifest.inputs, graph_in), ("output", manifest.outputs, graph_out)):
        missing = [n for n in declared if n not in actual]
        extra = [n for n in actual if n not in declared]
        if missing or extra:
            what = f"lacks {kind} {missing[0]!r}" if missing else f"has unexpected {kind} {extra[0]!r}"
            raise ModelDirError(f"{model_path}: graph does not match {MANIFEST_NAME}: it {what}")


def manifest_from_hf_dir(model_dir: Path) -> Manifest:
    """A directory exported by another tool (Optimum): config.json + model.onnx, no gptedge.json."""
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ModelDirError(f"{model_dir}: no {MANIFEST_NAME} and no config.json (not a model directory)")
    try:
        cfg = json.loads(config_path.read_text(encoding="utf-8"))
        model_type = cfg["model_type"]
        n_layer, n_head, n_embd = cfg["n_layer"], cfg["n_head"], cfg["n_embd"]
        shape = ModelShape(arch=model_type, n_layer=n_layer, n_head=n_head, head_dim=n_embd // n_head,
                           vocab_size=cfg["vocab_size"], context_length=cfg["n_positions"])
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ModelDirError(f"{config_path}: cannot read the model's shape ({type(e).__name__}: {e})") from None
    gen_cfg = {}
    if (model_dir / "generation_config.json").is_file():
        gen_cfg = json.loads((model_dir / "generation_config.json").read_text(encoding="utf-8"))
    eos = gen_cfg.get("eos_token_id", cfg.get("eos_token_id"))
    log.info("%s has no %s: shape read from config.json", model_dir, MANIFEST_NAME)
    return Manifest(shape=shape, eos_id=eos if isinstance(eos, int) else None,
                    bos_id=cfg.get("bos_token_id"), pad_id=gen_cfg.get("pad_token_id"),
                    source={"imported_from": "config.json"})
