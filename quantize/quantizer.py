"""gptedge quantize: guard -> rewrite -> save -> validate, the same for every method, into an atomic output dir.

What differs between methods (dynamic.py, static.py, weight_only.py) sits behind one entry
point each (methods.py); nothing here branches on the method's name.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np
import onnx

from gptedge import __version__, runtime
from gptedge.atomic import atomic_output_dir, check_output
from gptedge.onnx_files import save_onnx
from gptedge.runtime.errors import QuantizationError
from gptedge.runtime.checks.fingerprint import record_fingerprint
from gptedge.runtime.modeldir.genai_config import TOKENIZER_CONFIG, write_genai_files
from gptedge.runtime.modeldir.manifest import (Fingerprint, Manifest, Parity, Quantization, QuantizedParity, Source,
                                      read_manifest, write_manifest)
from gptedge.runtime.modeldir.recipe import QuantizeRecipe
from gptedge.runtime.modeldir.chat_template import CHAT_TEMPLATE_FILE
from gptedge.runtime.modeldir.tokenizer import TOKENIZER_FILE
from gptedge.runtime.modeldir.onnx_wire import is_ort_format

from . import kv_cache as kv
from .rotary_form import rotary_outside
from .base import Method, Quantized, QuantizeJob
from .methods import method

log = logging.getLogger(__name__)

__all__ = ["QuantizeRecipe", "quantize_model_dir", "compare_with_source"]

COPIED_FILES = ("config.json", "generation_config.json", TOKENIZER_FILE, CHAT_TEMPLATE_FILE, TOKENIZER_CONFIG)
FUSED_ATTENTION_OPS = ("MultiHeadAttention", "GroupQueryAttention")  # attention in one float contrib op
WORK_DIR = ".work"  # scratch inside the partial output dir, removed before it becomes the output


def _float_embedding(graph, vocab: int, width: int) -> bool:
    """Whether the graph still holds a float (V, C) token table (a task head's graph after a pass that
    quantizes MatMuls only: with no LM head there is no int8 weight for the embedding to share)."""
    return any(i.data_type in (1, 10) and list(i.dims) == [vocab, width] for i in graph.graph.initializer)


def describe(m: Method, done: Quantized, task_head: bool = False, embedding_float: bool = False) -> Quantization:
    """What the manifest says about how the weights and activations are stored; a task head's graph has no LM
    head, so its embedding is described as what the pass left of it."""
    storage = m.storage(done.recipe)
    if task_head:
        embedding = ("token embedding kept as float (no LM head to share a quantized weight with)" if embedding_float
                     else storage.embedding_and_lm_head.replace("tied weight", "token embedding").split("; LM head")[0]
                     + " (no LM head in a classifier graph)")
        kept = storage.kept_float + (", the token embedding" if embedding_float else "")
        kept += "" if done.recipe.quantize_head else ", the task head's linear"
        storage = dataclasses.replace(storage, embedding_and_lm_head=embedding, kept_float=kept)
    return Quantization(**asdict(done.recipe), **asdict(storage),
                        attention_products="int8" if done.recipe.quantize_attention else "float",
                        quantized_nodes=dict(Counter(done.nodes.values())))


def _check_source(model_dir: Path) -> Manifest:
    manifest = read_manifest(model_dir)  # raises for a dir without manifest
    if manifest.quantization or manifest.precision != "fp32":
        how = manifest.quantization.method if manifest.quantization else manifest.precision
        raise QuantizationError(f"{model_dir} is already quantized ({how}); quantize its fp32 source instead")
    if manifest.kv_cache != kv.DEFAULT_KV_CACHE:
        raise QuantizationError(f"{model_dir} already stores its KV cache as {manifest.kv_cache}; quantize its fp32 "
                                "source instead")
    if is_ort_format(model_dir / manifest.model_file):  # onnx cannot parse a flatbuffer: a DecodeError otherwise
        raise QuantizationError(f"{model_dir}: its graph {manifest.model_file} is in the ORT format (a mobile pack), "
                                "which quantize cannot read: quantize the model dir it was made from")
    return manifest


def _check_attention(m: Method, recipe: QuantizeRecipe, model: onnx.ModelProto) -> None:
    if not recipe.quantize_attention:
        return
    if not m.quantizes_attention:
        raise QuantizationError(f"--quantize-attention does not apply to {m.name}: its activations stay float")
    fused = next((n.op_type for n in model.graph.node if n.op_type in FUSED_ATTENTION_OPS), None)
    if fused:
        raise QuantizationError("--quantize-attention needs a graph exported with --plain-ops: this one computes "
                                f"attention in one fused float op ({fused})")


def quantize_model_dir(model_dir: str | Path, out: str | Path, recipe: QuantizeRecipe | None, force: bool = False,
                       calibration_text: str | None = None,
                       progress: Callable[[int, int], None] | None = None, record_input: bool = True,
                       kv_cache: str = kv.DEFAULT_KV_CACHE) -> Manifest:
    """record_input False: the manifest names only the fp32 dir's own source (export --precision fp16, whose
    fp32 dir is scratch). kv_cache: how a kv_buffer graph stores its cache (quantize/kv_cache.py); with recipe
    None the cache is all that changes (the weights stay fp32)."""
    model_dir, out = Path(model_dir), Path(out)
    manifest = _check_source(model_dir)
    check_output(out, force, inputs=[model_dir])
    if recipe is None and kv_cache == kv.DEFAULT_KV_CACHE:
        raise QuantizationError("nothing to do: give a quantization recipe, a KV cache other than fp32, or both")
    m = method(recipe.method) if recipe is not None else None
    if m is not None:
        m.check(recipe, manifest.shape, calibration_text)
    cache = kv.check_kv_cache(kv_cache, manifest.graph, recipe is not None and recipe.half_precision)
    scales = _kv_scales(model_dir, manifest, recipe, cache, calibration_text, progress)
    # The graph without its weights: the methods read each external weight when they quantize it
    # (Rewrite, from job.model_dir), so a 6 GB fp32 source is never in memory whole.
    model = onnx.load(str(model_dir / manifest.model_file), load_external_data=m is None)
    if m is not None:
        _check_attention(m, recipe, model)
    with atomic_output_dir(out, force, inputs=[model_dir]) as tmp:
        job = QuantizeJob(model, recipe, manifest, model_dir, tmp / WORK_DIR, calibration_text, progress)
        del model
        quantization = _rewrite_and_save(m, job, tmp / manifest.model_file, cache, scales)  # graphs gone on return
        for name in COPIED_FILES:
            if (model_dir / name).is_file():
                shutil.copyfile(model_dir / name, tmp / name)
        new = manifest.replace(precision=m.precision(recipe) if m else manifest.precision, quantization=quantization,
                               parity=Parity(), kv_cache=cache.name,
                               source=Source(quantized_from=str(model_dir.resolve()) if record_input else None,
                                             fp32_source=manifest.source,
                                             gptedge_version=__version__))
        new = write_manifest(tmp, new)  # records the files' sizes and hashes: the check below loads the dir
        device = "auto" if recipe is not None and recipe.half_precision else "cpu"  # fp16: on a GPU where there is one
        if new.task is None:
            write_genai_files(tmp, new)
            vs_fp32, fingerprint = check_against_source(model_dir, tmp, manifest.shape.vocab_size, device)
        else:  # a task head: no generation, so no GenAI config and no greedy fingerprint
            vs_fp32, fingerprint = check_head_against_source(model_dir, tmp, device), None
        new = write_manifest(tmp, new.replace(parity=Parity(vs_fp32=vs_fp32, fingerprint=fingerprint)))
    log.info("wrote %s (%s, %s, %s KV cache)", out, recipe.method if recipe else "fp32 weights", new.precision,
             new.kv_cache)
    return new


def _kv_scales(model_dir: Path, manifest: Manifest, recipe: QuantizeRecipe | None, cache: kv.KVCacheKind,
               text: str | None, progress) -> list[np.ndarray] | None:
    """An int8 / int4 cache's scales, measured on the fp32 source over the calibration text (before the
    weights are touched: the scales belong to the model, and its K/V move little with 8-bit weights)."""
    if not cache.quantized:
        return None
    defaults = QuantizeRecipe("dynamic")  # the calibration budget's defaults, when only the cache changes
    budget = (recipe or defaults).calibration_sequences * (recipe or defaults).calibration_length
    windows = kv.calibration_ids(model_dir, text, budget, manifest.shape.context_length)
    log.info("KV cache scales: %d windows of %d tokens", len(windows), windows[0].shape[1])
    return kv.scales_from_absmax(kv.measure_absmax(model_dir, windows, progress), cache)


def _rewrite_and_save(m: Method | None, job: QuantizeJob, path: Path, cache: kv.KVCacheKind,
                      scales: list[np.ndarray] | None) -> Quantization | None:
    """The method's rewrite (and the cache's), saved (weights in external data when big) -> what the manifest
    says about it (None: no method, the weights as they were)."""
    job.work_dir.mkdir()
    model = m.apply(job) if m is not None else None
    graph = model.model if model is not None else job.model
    if job.recipe is not None and job.recipe.half_precision:  # for the CUDA provider: the form checked there
        rotary_outside(graph, job.manifest.shape.head_dim)
    if cache.name != kv.DEFAULT_KV_CACHE:
        kv.rewrite_kv_cache(graph, cache, job.manifest.shape.head_dim, scales)
    shutil.rmtree(job.work_dir)
    save_onnx(graph, path)
    task_head = job.manifest.task is not None
    embedding_float = task_head and _float_embedding(graph, job.manifest.shape.vocab_size,
                                                   job.manifest.shape.n_embd)
    return describe(m, model, task_head, embedding_float) if m is not None else None


GREEDY_CHECK_TOKENS = 16


def _check_run(model_dir: Path, device: str, vocab: int, seed: int) -> tuple[np.ndarray, list[list[int]], str,
                                                                             Fingerprint]:
    """-> logits (2, S, V) on 64 seeded ids, greedy ids of 2 x 16 tokens from their first 8, the provider used,
    the dir's fingerprint (recorded in its manifest for `gptedge verify`)."""
    loaded = runtime.load(model_dir, device=device)
    context = loaded.manifest.shape.context_length
    ids = np.random.default_rng(seed).integers(0, vocab, size=(2, min(32, context)), dtype=np.int64)
    mask = np.ones_like(ids)
    pos = np.broadcast_to(np.arange(ids.shape[1]), ids.shape).copy()
    logits = loaded.forward(ids, mask, pos, loaded.empty_past(2))[0]
    prompts = [row[: max(1, min(8, context - GREEDY_CHECK_TOKENS))].tolist() for row in ids]
    n = min(GREEDY_CHECK_TOKENS, context - len(prompts[0]))
    greedy = [r.ids for r in loaded.generate_batch(prompts, n, greedy=True, ignore_eos=True, with_text=False)]
    return logits, greedy, loaded.providers[0], record_fingerprint(loaded)


def compare_with_source(fp32_dir: Path, int8_dir: Path, vocab: int, device: str = "cpu",
                        seed: int = 0) -> QuantizedParity:
    return check_against_source(fp32_dir, int8_dir, vocab, device, seed)[0]


def check_against_source(fp32_dir: Path, int8_dir: Path, vocab: int, device: str = "cpu",
                         seed: int = 0) -> tuple[QuantizedParity, Fingerprint]:
    """A sanity check recorded in the manifest: logits of both graphs on a fixed batch of ids, and how many
    leading greedy tokens they share. The fp32 graph runs on the CPU, the quantized one on `device`.

    One session at a time: the fp32 one is released before the quantized one loads (GPT-2 XL's fp32
    session alone holds 6 GB of prepacked weights)."""
    a, want, _, _ = _check_run(fp32_dir, "cpu", vocab, seed)
    b, got, provider, fingerprint = _check_run(int8_dir, device, vocab, seed)
    if not np.isfinite(b).all():
        raise QuantizationError("quantized graph produced non-finite logits")
    same = total = 0
    for x, y in zip(want, got, strict=True):
        same += next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
        total += max(len(x), len(y))
    return QuantizedParity(max_abs_logit_diff=float(np.abs(a - b).max()),
                           top1_agreement=float((a.argmax(-1) == b.argmax(-1)).mean()), inputs="64 seeded random ids",
                           device=provider.replace("ExecutionProvider", "").lower(),
                           greedy_agreement=same / total if total else 1.0), fingerprint


def _head_check_run(model_dir: Path, device: str, seed: int) -> tuple[np.ndarray, str]:
    """-> a classifier dir's head logits on seeded right-padded rows (4 rows of up to 32 ids; multiple choice:
    2 examples x 2 choices), and the provider used."""
    clf = runtime.load_classifier(model_dir, device=device)
    rng = np.random.default_rng(seed)
    S = min(32, clf.manifest.shape.context_length)
    ids = rng.integers(0, clf.manifest.shape.vocab_size, size=(4, S), dtype=np.int64)
    mask = (np.arange(S) < np.array([S, S - 3, S // 2, 2])[:, None]).astype(np.int64)
    if clf.choice:
        ids, mask = ids.reshape(2, 2, S), mask.reshape(2, 2, S)
    return clf.logits(ids, mask), clf.providers[0]


def check_head_against_source(fp32_dir: Path, q_dir: Path, device: str = "cpu", seed: int = 0) -> QuantizedParity:
    """A classifier dir's head logits against its fp32 source's on the same seeded rows: max |diff| and how often
    the best label (or choice) agrees; the fp32 graph on the CPU, the quantized one on `device`."""
    a, _ = _head_check_run(fp32_dir, "cpu", seed)
    b, provider = _head_check_run(q_dir, device, seed)
    if not np.isfinite(b).all():
        raise QuantizationError("quantized graph produced non-finite logits")
    return QuantizedParity(max_abs_logit_diff=float(np.abs(a - b).max()),
                           top1_agreement=float((a.argmax(-1) == b.argmax(-1)).mean()),
                           inputs="4 seeded rows of random ids, right-padded",
                           device=provider.replace("ExecutionProvider", "").lower())
