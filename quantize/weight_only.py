"""Weight-only 8-bit: MatMulNBits with one scale per block of weights along K; activations stay float
(or are quantized per block inside the kernel, accuracy_level 4).

Every linear MatMul and the tied LM head become MatMulNBits (a task head's linear only with
recipe.quantize_head); the embedding gathers rows of the same blocks and dequantizes them with plain ops.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from gptedge.onnx_files import Initializers
from gptedge.runtime.errors import InvalidArgumentError
from gptedge.runtime.modeldir.manifest import ModelShape
from gptedge.runtime.modeldir.recipe import QuantizeRecipe, block_linears, kept_at_8bit

from . import int8_math as qm
from . import nbit_math as nm
from .awq import awq_overrides, fold_sites
from .base import Method, Quantized, QuantizeJob, Storage
from .gptq import gptq_blocks
from .packed_linears import pack_sibling_linears
from .fp16 import ACTIVATIONS as FP16_ACTIVATIONS
from .fp16 import to_float16
from .rewrite import MS_DOMAIN, Rewrite
from .rotation import rotate_down_inputs

log = logging.getLogger(__name__)


def _blocked_weight(r: Rewrite, name: str, w_rows: np.ndarray, bits: int, block_size: int,
                    symmetric: bool, scale_search: str = "range", rounded: tuple | None = None) -> list[str]:
    """Rows (N, K) -> MatMulNBits' B, scales[, zero_points] initializers; their names. rounded: those arrays
    already made (gptq.py's, in the same layout), written instead."""
    if rounded is not None:
        suffixes = (".q8", ".scales") if bits == 8 else (".q4", ".scales", ".zero_points")
        return [r.init(f"{name}{sfx}", a) for sfx, a in zip(suffixes, rounded, strict=False) if a is not None]
    if bits == 8:
        q, scale = qm.quantize_blocks_u8(w_rows, block_size, scale_search)  # (N, K/bs, bs), (N, K/bs)
        return [r.init(f"{name}.q8", q), r.init(f"{name}.scales", scale)]
    # (N, K/bs, bs/2), (N, K/bs), packed zp
    q, scale, zp = nm.quantize_4bit(w_rows, block_size, symmetric, scale_search=scale_search)
    names = [r.init(f"{name}.q4", q), r.init(f"{name}.scales", scale)]
    return names if zp is None else names + [r.init(f"{name}.zero_points", zp)]


def _unpack_nibbles(r: Rewrite, src: str, shape: list[int], prefix: str) -> str:
    """uint8 (..., n) -> uint8 (..., 2n) in the graph, low nibble first; `shape` is the Reshape target.

    BitShift (opset 11) rather than BitwiseAnd (opset 18): exported graphs are opset 17."""
    four = r.init(f"{prefix}.four", np.array(4, np.uint8))
    r.node("BitShift", [src, four], [f"{prefix}.hi"], f"{prefix}.hi", direction="RIGHT")
    r.node("BitShift", [f"{prefix}.hi", four], [f"{prefix}.hi16"], f"{prefix}.hi16", direction="LEFT")
    r.node("Sub", [src, f"{prefix}.hi16"], [f"{prefix}.lo"], f"{prefix}.lo")
    axes = r.init(f"{prefix}.axes", np.array([-1], np.int64))
    r.node("Unsqueeze", [f"{prefix}.lo", axes], [f"{prefix}.lo1"], f"{prefix}.lo1")
    r.node("Unsqueeze", [f"{prefix}.hi", axes], [f"{prefix}.hi1"], f"{prefix}.hi1")
    r.node("Concat", [f"{prefix}.lo1", f"{prefix}.hi1"], [f"{prefix}.pairs"], f"{prefix}.pairs", axis=-1)
    r.node("Reshape", [f"{prefix}.pairs", r.init(f"{prefix}.shape", np.array(shape, np.int64))],
           [f"{prefix}.unpacked"], f"{prefix}.unpack")
    return f"{prefix}.unpacked"


def _embedding(r: Rewrite, node: onnx.NodeProto, weight: list[str], bits: int, n_blocks: int,
               block_size: int, width: int) -> None:
    """Gather rows of the LM head's blocks and dequantize them: (q - zero point) * scale per block."""
    ids, out, name = node.input[1], node.output[0], node.name
    r.node("Gather", [weight[0], ids], [f"{out}.q"], f"{name}.q")  # (B, S, C/bs, bs or bs/2) uint8
    q = f"{out}.q" if bits == 8 else _unpack_nibbles(r, f"{out}.q", [0, 0, n_blocks, block_size], f"{name}.q4")
    r.node("Cast", [q], [f"{out}.f"], f"{name}.cast", to=TensorProto.FLOAT)
    if len(weight) == 3:  # asymmetric 4-bit: per-block zero points, packed two per byte
        r.node("Gather", [weight[2], ids], [f"{out}.zq"], f"{name}.zq")  # (B, S, ceil(C/bs/2))
        pairs = -(-n_blocks // 2)
        z = _unpack_nibbles(r, f"{out}.zq", [0, 0, 2 * pairs], f"{name}.zp4")
        if 2 * pairs != n_blocks:
            r.node("Slice", [z, r.init(f"{name}.zstart", np.array([0], np.int64)),
                             r.init(f"{name}.zend", np.array([n_blocks], np.int64)),
                             r.init(f"{name}.zaxis", np.array([-1], np.int64))], [f"{out}.zs"], f"{name}.zslice")
            z = f"{out}.zs"
        r.node("Cast", [z], [f"{out}.zf"], f"{name}.zcast", to=TensorProto.FLOAT)
        r.node("Unsqueeze", [f"{out}.zf", r.init(f"{name}.zaxes", np.array([-1], np.int64))], [f"{out}.zp"],
               f"{name}.zunsqueeze")
        zp = f"{out}.zp"
    else:
        zp = r.init(f"{name}.zp", np.array(128.0 if bits == 8 else float(nm.SYMMETRIC_ZERO_POINT), np.float32))
    r.node("Sub", [f"{out}.f", zp], [f"{out}.c"], f"{name}.center")
    r.node("Gather", [weight[1], ids], [f"{out}.s"], f"{name}.scale")  # (B, S, C/bs)
    r.node("Unsqueeze", [f"{out}.s", r.init(f"{name}.axes", np.array([-1], np.int64))], [f"{out}.s1"],
           f"{name}.unsqueeze")
    r.node("Mul", [f"{out}.c", f"{out}.s1"], [f"{out}.blocks"], f"{name}.dequantize")
    r.node("Reshape", [f"{out}.blocks", r.init(f"{name}.shape", np.array([0, 0, width], np.int64))],
           [out], f"{name}.reshape")


def rewrite_weight_only(model: onnx.ModelProto, block_size: int = 32, accuracy_level: int = 0, bits: int = 8,
                        symmetric: bool = True, embedding_bits: int | None = None, base_dir: Path | None = None,
                        quantize_head: bool = True,
                        keep_8bit: tuple[str, ...] = (), scale_search: str = "range",
                        overrides: dict[str, np.ndarray] | None = None,
                        linear_names: dict[str, str] | None = None,
                        rounded: dict[str, tuple] | None = None) -> tuple[onnx.ModelProto, dict[str, str]]:
    """Linear MatMuls and the LM head -> MatMulNBits (`bits`-bit blocks along K, activations stay float).

    The tied embedding is stored once in MatMulNBits' layout, at `embedding_bits` (default: `bits`):
    8-bit (V, C/bs, bs) uint8, or 4-bit (V, C/bs, bs/2) two per byte; the embedding gathers rows of it,
    unpacks nibbles with BitShift where 4-bit, and dequantizes them with plain ops. 8-bit blocks are
    always symmetric (zero point 128); `symmetric` applies to the 4-bit ones. base_dir: the model's
    directory, where its external data (if any) is read from. keep_8bit: patterns of linears stored at
    8 bits in a 4-bit rewrite (mixed precision; each still one MatMulNBits node, bits=8). scale_search: how
    each block's scale is chosen (recipe.SCALE_SEARCHES). overrides: initializers' new float values by name,
    read instead of the source's (awq.py's fold: LayerNorm gamma / beta and the linears' scaled weights).
    linear_names: graph name -> neutral name of each block linear (recipe.block_linears), what keep_8bit matches
    besides the graph's own names; None: the graph's names alone. rounded: linears' MatMulNBits initializers
    already made by weight name (gptq.py's), written instead of rounding their weights here.
    """
    embedding_bits = embedding_bits or bits
    r = Rewrite(model, base_dir)
    for name, value in (overrides or {}).items():  # a linear's weight is read back below; the LN's stay as inits
        r.init(name, value)
    float_head = None if quantize_head else r.head_linear()  # a task head's score, kept a float MatMul
    untied = r.untied_head()  # an untied head: its (V, C) weight is its own, quantized as the embedding is
    if untied is not None:
        gather, gemm = untied
        wte = gather.input[0]
    else:
        wte, gather, gemm = r.tied_embedding()
    vocab, width = r.weights.shape(wte)
    tied = _blocked_weight(r, wte, r.weights[wte], embedding_bits, block_size, symmetric, scale_search)
    head = tied if untied is None else _blocked_weight(r, gemm.input[1], r.weights[gemm.input[1]], embedding_bits,
                                                       block_size, symmetric, scale_search)
    sym = "symmetric" if symmetric or embedding_bits == 8 else "asymmetric"
    for node in model.graph.node:
        if node is gather:
            _embedding(r, node, tied, embedding_bits, width // block_size, block_size, width)
            r.quantized[node.name] = (f"{embedding_bits}-bit {sym} embedding (blocks of {block_size}, "
                                      "shared with the LM head)")
        elif node is gemm:
            r.node("MatMulNBits", [node.input[0], *head], list(node.output), node.name, domain=MS_DOMAIN,
                   K=width, N=vocab, bits=embedding_bits, block_size=block_size, accuracy_level=accuracy_level)
            r.quantized[node.name] = (f"MatMulNBits (LM head, {'tied ' if untied is None else ''}"
                                      f"{embedding_bits}-bit weight)")
        elif r.is_linear(node) and node.name != float_head:
            w = r.new_inits.get(node.input[1], r.weights[node.input[1]])  # (K, N)
            graph_name = node.input[1].removesuffix(".weight")
            names = (graph_name, (linear_names or {}).get(graph_name, graph_name))
            width_bits = 8 if kept_at_8bit(names, keep_8bit) else bits
            made = (rounded or {}).get(node.input[1])
            r.node("MatMulNBits", [node.input[0], *_blocked_weight(r, node.input[1], w.T, width_bits, block_size,
                                                                   symmetric, scale_search, made)],
                   list(node.output), node.name, domain=MS_DOMAIN, K=w.shape[0], N=w.shape[1], bits=width_bits,
                   block_size=block_size, accuracy_level=accuracy_level)
            r.quantized[node.name] = (f"MatMulNBits ({width_bits}-bit)" if width_bits != 8 or bits != 8
                                      else "MatMulNBits")
        else:
            r.new_nodes.append(node)
    return r.finish(f"gptedge weight-only int{bits}"), r.quantized


def check(recipe: QuantizeRecipe, shape: ModelShape, calibration_text: str | None) -> None:
    """Block size must divide n_embd (the rewrite checks every linear's K: the MLP width too). A block size that
    cannot is the command line's fault: InvalidArgumentError (exit 2), naming the sizes that fit. awq needs the
    calibration text its scales are measured on."""
    for flag, asked in (("--awq", recipe.awq), ("--gptq", recipe.gptq)):
        if asked and calibration_text is None:
            raise InvalidArgumentError(f"{flag} needs --calibration TEXT_FILE (it is measured on it)")
    if shape.n_embd % recipe.block_size:
        fit = [b for b in (16, 32, 64, 128, 256, 512) if shape.n_embd % b == 0]
        raise InvalidArgumentError(f"--block-size {recipe.block_size} does not divide n_embd {shape.n_embd}: "
                                   f"choose {', '.join(map(str, fit)) or 'a power of two >= 16 that divides it'}")
    names = block_linears(shape.n_layer, shape.arch)
    for pattern in recipe.keep_8bit:  # a pattern that keeps nothing is a typo, not a recipe
        if not any(kept_at_8bit(pair, (pattern,)) for pair in names.items()):
            neutral = " / ".join(sorted({n.split(".", 2)[2] for n in names.values()}))
            raise InvalidArgumentError(f"--keep-8bit {pattern!r} matches no linear: they are named h.N.{{{neutral}}} "
                                       f"(N = 0 .. {shape.n_layer - 1}), or as the graph names them "
                                       f"({next(iter(names))})")


def linear_widths(model: onnx.ModelProto, base_dir: Path | None) -> dict[str, int]:
    """K of every linear the rewrite turns into MatMulNBits, by weight name: n_embd, and the MLP width for the MLP's
    second linear (not in the manifest's shape)."""
    weights = Initializers(model, base_dir)
    return {n.input[1]: weights.shape(n.input[1])[0] for n in model.graph.node
            if n.op_type == "MatMul" and n.input[1] in weights and len(weights.shape(n.input[1])) == 2}


def apply(job: QuantizeJob) -> Quantized:
    rc = job.recipe
    widths = linear_widths(job.model, job.model_dir)
    for name, k in widths.items():  # before AWQ / GPTQ round in blocks: check() saw n_embd, not the MLP width
        if k % rc.block_size:
            fit = [b for b in (16, 32, 64, 128, 256) if all(w % b == 0 for w in widths.values())]
            raise InvalidArgumentError(f"--block-size {rc.block_size} does not divide {name}'s K={k}: choose "
                                       f"{', '.join(map(str, fit)) or 'a power of two >= 16 that divides every K'}")
    names = block_linears(job.manifest.shape.n_layer, job.manifest.shape.arch)
    if rc.rotate_down:  # first: AWQ and GPTQ calibrate on the rotated graph, and its down weights are the rotated ones
        job = replace(job, model=rotate_down_inputs(job.model, Initializers(job.model, job.model_dir), names,
                                                    rc.block_size))
    if rc.awq and not fold_sites(job.model, Initializers(job.model, job.model_dir)):
        # no normalization's affine or gated product feeds only linears: nothing to fold scales into. The
        # manifest records the recipe as applied, so without awq
        log.warning("--awq: no normalization or gated product feeds only linears in this graph; quantizing without it")
        rc = replace(rc, awq=False)
    overrides = (awq_overrides(job.model, rc, job.manifest, job.model_dir, job.calibration_text, job.work_dir)
                 if rc.awq else None)
    rounded = (gptq_blocks(job.model, rc, job.manifest, job.model_dir, job.calibration_text, job.work_dir, overrides,
                           names) if rc.gptq else None)
    model, nodes = rewrite_weight_only(job.model, rc.block_size, rc.accuracy_level, rc.bits, rc.symmetric,
                                       rc.embedding_bits, base_dir=job.model_dir,
                                       quantize_head=rc.quantize_head, keep_8bit=rc.keep_8bit,
                                       scale_search=rc.scale_search, overrides=overrides,  # initializers inline
                                       linear_names=names, rounded=rounded)
    model = pack_sibling_linears(model)  # exact: a gated MLP's gate and up as one node (and a Split)
    if rc.float16:
        model = to_float16(model)  # MatMulNBits' scales and activations become fp16 with the rest
    return Quantized(model, nodes, rc)


def _layout(bits: int, symmetric: bool) -> str:
    if bits == 8:
        return "8-bit, symmetric (zero point 128)"
    return "4-bit, " + ("symmetric (zero point 8)" if symmetric else "asymmetric (a 4-bit zero point per block)")


def storage(recipe: QuantizeRecipe) -> Storage:
    activations = ("float" if recipe.accuracy_level == 0 else
                   f"quantized per block inside MatMulNBits (accuracy_level {recipe.accuracy_level})")
    if recipe.float16:
        activations = f"{FP16_ACTIVATIONS} (on the CPU: {activations})"
    shape = "(V, C/bs, bs)" if recipe.embedding_bits == 8 else "(V, C/bs, bs/2), two weights per byte"
    kept = (f"; at 8 bits, symmetric: {', '.join(recipe.keep_8bit)}" if recipe.keep_8bit else "")
    kept += "; scales and zero points by least squared error" if recipe.scale_search == "mse" else ""
    kept += ("; activation-aware input-channel scales folded into the normalizations (and a gated MLP's up "
             "projection) before the linears they feed" if recipe.awq else "")
    kept += ("; the linears' weights rounded by GPTQ (second-order, on the calibration text's activations)"
             if recipe.gptq else "")
    kept += (f"; each MLP down projection's input rotated by a randomized Hadamard transform (blocks of "
             f"{recipe.block_size}, float) and its weight rows by the inverse" if recipe.rotate_down else "")
    return Storage(weights=f"MatMulNBits {_layout(recipe.bits, recipe.symmetric)}, one scale per block of "
                           f"{recipe.block_size} along K{kept}",
                   activations=activations,
                   embedding_and_lm_head="tied weight stored once as "
                                         f"{_layout(recipe.embedding_bits, recipe.symmetric)} "
                                         f"MatMulNBits blocks {shape}; LM head MatMulNBits, embedding gathers rows "
                                         "and dequantizes",
                   kept_float="position embedding, LayerNorms, biases" + (" (as fp16)" if recipe.float16 else ""))


# Activations reach QK^T and PV in float: there is nothing for --quantize-attention to act on.
METHOD = Method(name="weight-only", check=check, apply=apply, storage=storage, quantizes_attention=False)
