"""gptedge quantize: guard -> rewrite -> save -> validate, the same for every method, into an atomic output dir.

What differs between methods (dynamic.py, static.py, weight_only.py) sits behind one entry
point each (methods.py); nothing here branches on the method's name.
"""

from __future__ import annotations

import logging
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np
import onnx

from gptedge import __version__
from gptedge.atomic import atomic_output_dir, check_output
from gptedge.onnx_files import save_onnx
from gptedge.runtime.errors import QuantizationError
from gptedge.runtime.genai_config import write_genai_files
from gptedge.runtime.manifest import (Manifest, Parity, Quantization, QuantizedParity, Source, read_manifest,
                                      write_manifest)
from gptedge.runtime.tokenizer import TOKENIZER_FILE

from .methods import Method, Quantized, QuantizeJob, method
from .recipe import QuantizeRecipe

log = logging.getLogger(__name__)

__all__ = ["QuantizeRecipe", "quantize_model_dir", "compare_with_source"]

COPIED_FILES = ("config.json", "generation_config.json", TOKENIZER_FILE)
FUSED_ATTENTION_OPS = ("MultiHeadAttention", "GroupQueryAttention")  # attention in one float contrib op
WORK_DIR = ".work"  # scratch inside the partial output dir, removed before it becomes the output


def describe(m: Method, done: Quantized) -> Quantization:
    """What the manifest says about how the weights and activations are stored."""
    return Quantization(**asdict(done.recipe), **asdict(m.storage(done.recipe)),
                        attention_products="int8" if done.recipe.quantize_attention else "float",
                        quantized_nodes=dict(Counter(done.nodes.values())))


def _check_source(model_dir: Path) -> Manifest:
    manifest = read_manifest(model_dir)  # raises for a dir without manifest
    if manifest.quantization or manifest.precision != "fp32":
        how = manifest.quantization.method if manifest.quantization else manifest.precision
        raise QuantizationError(f"{model_dir} is already quantized ({how}); quantize its fp32 source instead")
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


def quantize_model_dir(model_dir: str | Path, out: str | Path, recipe: QuantizeRecipe, force: bool = False,
                       calibration_text: str | None = None,
                       progress: Callable[[int, int], None] | None = None, record_input: bool = True) -> Manifest:
    """record_input False: the manifest names only the fp32 dir's own source (export --precision fp16, whose
    fp32 dir is scratch)."""
    model_dir, out = Path(model_dir), Path(out)
    manifest = _check_source(model_dir)
    check_output(out, force, inputs=[model_dir])
    m = method(recipe.method)
    m.check(recipe, manifest.shape, calibration_text)
    model = onnx.load(str(model_dir / manifest.model_file))  # external data, if any, is read too
    _check_attention(m, recipe, model)
    with atomic_output_dir(out, force, inputs=[model_dir]) as tmp:
        work = tmp / WORK_DIR
        work.mkdir()
        done = m.apply(QuantizeJob(model, recipe, manifest, model_dir, work, calibration_text, progress))
        shutil.rmtree(work)
        save_onnx(done.model, tmp / manifest.model_file)
        for name in COPIED_FILES:
            if (model_dir / name).is_file():
                shutil.copyfile(model_dir / name, tmp / name)
        new = manifest.replace(precision=m.precision(done.recipe), quantization=describe(m, done), parity=Parity(),
                               source=Source(quantized_from=str(model_dir.resolve()) if record_input else None, fp32_source=manifest.source,
                                             gptedge_version=__version__))
        write_manifest(tmp, new)
        write_genai_files(tmp, new)
        device = "auto" if recipe.half_precision else "cpu"  # fp16 graphs are checked on the GPU where there is one
        new = new.replace(parity=Parity(vs_fp32=compare_with_source(model_dir, tmp, manifest.shape.vocab_size, device)))
        write_manifest(tmp, new)
    log.info("wrote %s (%s, %s)", out, recipe.method, new.precision)
    return new


GREEDY_CHECK_TOKENS = 16


def compare_with_source(fp32_dir: Path, int8_dir: Path, vocab: int, device: str = "cpu", seed: int = 0) -> QuantizedParity:
    """A sanity check recorded in the manifest: logits of both graphs on a fixed batch of ids, and how many
    leading greedy tokens they share. The fp32 graph runs on the CPU; the quantized one on `device`."""
    from gptedge.runtime import load

    ref, got = load(fp32_dir, device="cpu"), load(int8_dir, device=device)
    rng = np.random.default_rng(seed)
    context = ref.manifest.shape.context_length
    ids = rng.integers(0, vocab, size=(2, min(32, context)), dtype=np.int64)
    mask = np.ones_like(ids)
    pos = np.broadcast_to(np.arange(ids.shape[1]), ids.shape).copy()
    a, _ = ref.forward(ids, mask, pos, ref.empty_past(2))
    b, _ = got.forward(ids, mask, pos, got.empty_past(2))
    if not np.isfinite(b).all():
        raise QuantizationError("quantized graph produced non-finite logits")
    prompts = [row[: min(8, context - GREEDY_CHECK_TOKENS)].tolist() for row in ids]
    n = min(GREEDY_CHECK_TOKENS, context - len(prompts[0]))
    same = total = 0
    for x, y in zip(*(m.generate_batch(prompts, n, greedy=True, ignore_eos=True, with_text=False) for m in (ref, got))):
        lead = next((i for i, (p, q) in enumerate(zip(x.ids, y.ids)) if p != q), min(len(x.ids), len(y.ids)))
        same, total = same + lead, total + max(len(x.ids), len(y.ids))
    return QuantizedParity(max_abs_logit_diff=float(np.abs(a - b).max()),
                           top1_agreement=float((a.argmax(-1) == b.argmax(-1)).mean()), inputs="64 seeded random ids",
                           device=got.providers[0].replace("ExecutionProvider", "").lower(),
                           greedy_agreement=same / total if total else 1.0)
