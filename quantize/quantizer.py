"""gptedge quantize: guard -> load -> quantize -> validate -> save, into a new model directory."""

from __future__ import annotations

import logging
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx

from gptedge import __version__
from gptedge.atomic import atomic_output_dir, check_output
from gptedge.onnx_files import save_onnx
from gptedge.runtime.errors import InvalidArgumentError, QuantizationError
from gptedge.runtime.genai_config import write_genai_files
from gptedge.runtime.graph_variant import variant_class
from gptedge.runtime.manifest import (Manifest, Parity, Quantization, QuantizedParity, Source, read_manifest,
                                      write_manifest)
from gptedge.runtime.tokenizer import TOKENIZER_FILE

from .graph_rewrite import rewrite_dynamic, rewrite_weight_only

log = logging.getLogger(__name__)

METHODS = ("dynamic", "static", "weight-only")
COPIED_FILES = ("config.json", "generation_config.json", TOKENIZER_FILE)


@dataclass(frozen=True)
class QuantizeRecipe:
    method: str
    per_channel: bool = True  # dynamic / static: one weight scale per output channel (else one per tensor)
    block_size: int = 32  # weight-only: weights per scale along K
    # weight-only: MatMulNBits compute. 4 (default): activations quantized per block of 32 inside the
    # kernel, int8 dot products; 0: float activations, exact to the weights, but ONNX Runtime 1.31 has
    # no fast 8-bit kernel for it on CPU (GPT-2 small: 2.5 tok/s against 64 at level 4, one thread).
    accuracy_level: int = 4
    quantize_attention: bool = False  # dynamic / static: also quantize QK^T and PV (activation x activation)
    calibration_sequences: int = 32  # static
    calibration_length: int = 128  # static

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise InvalidArgumentError(f"unknown method {self.method!r}: choose {', '.join(METHODS)}")
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise InvalidArgumentError(f"block size must be a power of two >= 16, got {self.block_size}")
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            raise InvalidArgumentError(f"accuracy level must be 0..4, got {self.accuracy_level}")
        if self.calibration_sequences < 1 or self.calibration_length < 2:
            raise InvalidArgumentError("calibration needs at least one sequence of two tokens")


def describe(recipe: QuantizeRecipe, quantized_nodes: dict[str, int]) -> Quantization:
    """What the manifest says about how the weights and activations are stored."""
    scales = "per output channel" if recipe.per_channel else "per tensor"
    if recipe.method == "weight-only":
        weights = f"8-bit MatMulNBits, symmetric, one scale per block of {recipe.block_size} along K"
        activations = ("float" if recipe.accuracy_level == 0 else
                       f"quantized per block inside MatMulNBits (accuracy_level {recipe.accuracy_level})")
        embedding = "tied weight stored once as MatMulNBits blocks (V, C/bs, bs); LM head MatMulNBits, embedding gathers rows and dequantizes"
    elif recipe.method == "dynamic":
        weights, activations = f"s8 symmetric, {scales}", "u8 quantized at run time (DynamicQuantizeMatMul)"
        embedding = "tied weight stored once as int8 (C, V), one scale per vocabulary row; LM head DynamicQuantizeMatMul, embedding Gather(axis=1)"
    else:
        weights, activations = f"s8 symmetric, {scales} (QDQ)", "u8, ranges calibrated on text (QDQ)"
        embedding = "tied weight stored once as int8 (C, V) QDQ; LM head MatMul, embedding Gather(axis=1) of the same int8 weight"
    return Quantization(**asdict(recipe), weights=weights, activations=activations, embedding_and_lm_head=embedding,
                        attention_products="int8" if recipe.quantize_attention else "float",
                        kept_float="position embedding, LayerNorms, biases", quantized_nodes=quantized_nodes)


def _check_source(model_dir: Path) -> Manifest:
    manifest = read_manifest(model_dir)  # raises for a dir without manifest
    if manifest.quantization or manifest.precision != "fp32":
        how = manifest.quantization.method if manifest.quantization else manifest.precision
        raise QuantizationError(f"{model_dir} is already quantized ({how}); quantize its fp32 source instead")
    return manifest


def quantize_model_dir(model_dir: str | Path, out: str | Path, recipe: QuantizeRecipe, force: bool = False,
                       calibration_text: str | None = None,
                       progress: Callable[[int, int], None] | None = None) -> Manifest:
    model_dir, out = Path(model_dir), Path(out)
    manifest = _check_source(model_dir)
    check_output(out, force)
    if recipe.method == "static" and calibration_text is None:
        raise QuantizationError("static quantization needs --calibration TEXT_FILE")
    model = onnx.load(str(model_dir / manifest.model_file))  # external data, if any, is read too
    fused_ops = ("MultiHeadAttention", "GroupQueryAttention")
    fused = next((n.op_type for n in model.graph.node if n.op_type in fused_ops), None)
    if recipe.quantize_attention and fused:
        raise QuantizationError("--quantize-attention needs a graph exported with --plain-ops: this one computes "
                                f"attention in one fused float op ({fused})")
    shape = manifest.shape
    if recipe.method == "dynamic":
        quantized, nodes = rewrite_dynamic(model, recipe.per_channel, recipe.quantize_attention)
    elif recipe.method == "weight-only":
        if shape.n_embd % recipe.block_size:
            raise QuantizationError(f"n_embd {shape.n_embd} is not a multiple of block size {recipe.block_size}")
        quantized, nodes = rewrite_weight_only(model, recipe.block_size, recipe.accuracy_level)
    else:
        from gptedge.runtime.tokenizer import encode, load_tokenizer

        from .static_qdq import TextCalibrationReader, calibration_windows, quantize_static_qdq

        ids = encode(load_tokenizer(model_dir), calibration_text)
        length = min(recipe.calibration_length, shape.context_length)
        windows = calibration_windows(ids, recipe.calibration_sequences, length)
        reader = TextCalibrationReader(windows, variant_class(manifest.graph), shape, progress)
        quantized = quantize_static_qdq(model, reader, recipe.per_channel, recipe.quantize_attention)
        nodes = {n.name: n.op_type for n in quantized.graph.node if n.op_type == "QuantizeLinear"}
    with atomic_output_dir(out, force) as tmp:
        save_onnx(quantized, tmp / manifest.model_file)
        for name in COPIED_FILES:
            if (model_dir / name).is_file():
                shutil.copyfile(model_dir / name, tmp / name)
        new = manifest.replace(precision="int8", quantization=describe(recipe, dict(Counter(nodes.values()))),
                               parity=Parity(), source=Source(quantized_from=str(model_dir.resolve()),
                                                              fp32_source=manifest.source, gptedge_version=__version__))
        write_manifest(tmp, new)
        write_genai_files(tmp, new)
        new = new.replace(parity=Parity(vs_fp32=compare_with_source(model_dir, tmp, shape.vocab_size)))
        write_manifest(tmp, new)
    log.info("wrote %s (%s)", out, recipe.method)
    return new


def compare_with_source(fp32_dir: Path, int8_dir: Path, vocab: int, seed: int = 0) -> QuantizedParity:
    """A sanity check recorded in the manifest: logits of both graphs on a fixed batch of ids."""
    from gptedge.runtime import load

    ref, got = load(fp32_dir, device="cpu"), load(int8_dir, device="cpu")
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, size=(2, min(32, ref.manifest.shape.context_length)), dtype=np.int64)
    mask = np.ones_like(ids)
    pos = np.broadcast_to(np.arange(ids.shape[1]), ids.shape).copy()
    a, _ = ref.forward(ids, mask, pos, ref.empty_past(2))
    b, _ = got.forward(ids, mask, pos, got.empty_past(2))
    if not np.isfinite(b).all():
        raise QuantizationError("quantized graph produced non-finite logits")
    return QuantizedParity(max_abs_logit_diff=float(np.abs(a - b).max()),
                           top1_agreement=float((a.argmax(-1) == b.argmax(-1)).mean()), inputs="64 seeded random ids")
