"""Static INT8: QDQ with activation ranges calibrated on real text (ONNX Runtime's calibrator).

The tied embedding / LM head is first rewritten so one (C, V) weight serves both: the LM head
as a plain MatMul (which the QDQ quantizer quantizes per vocabulary column), the embedding as
a Gather along axis 1. After quantization the Gather is pointed at the quantized weight, so
the weight is stored once, in int8. Every file the calibration writes (ONNX Runtime's
augmented model included) lives in the job's work directory, inside the partial output.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from gptedge.onnx_files import external_data_path, save_onnx
from gptedge.runtime.classify import HeadFeeds
from gptedge.runtime.errors import InvalidArgumentError, QuantizationError
from gptedge.runtime.graphs.graph_variant import GraphVariant, variant_class
from gptedge.runtime.graphs.quiet_logs import ORT_ERROR, quiet_logs
from gptedge.runtime.modeldir.manifest import ModelShape
from gptedge.runtime.modeldir.recipe import QuantizeRecipe
from gptedge.runtime.modeldir.tokenizer import encode, load_tokenizer

from .base import Method, Quantized, QuantizeJob, Storage
from .kv_cache import bos_first
from .rewrite import Rewrite

log = logging.getLogger(__name__)


def untie_to_matmul(model: onnx.ModelProto, base_dir: Path | None = None) -> tuple[onnx.ModelProto, str]:
    """Gather(wte (V, C)) + Gemm(h, wte, transB) -> Gather(wte_t (C, V), axis=1) + MatMul(h, wte_t).
    base_dir: the model's directory, where its external data (if any) is read from."""
    r = Rewrite(model, base_dir)
    wte, gather, gemm = r.tied_embedding()
    wt = r.init(f"{wte}.t", np.ascontiguousarray(r.weights[wte].T))  # (C, V)
    for node in model.graph.node:
        if node is gather:
            out = node.output[0]
            r.node("Gather", [wt, node.input[1]], [f"{out}.cbs"], node.name, axis=1)  # (C, B, S)
            r.node("Transpose", [f"{out}.cbs"], [out], f"{node.name}.t", perm=[1, 2, 0])  # (B, S, C)
        elif node is gemm:
            r.node("MatMul", [node.input[0], wt], list(node.output), node.name)
        else:
            r.new_nodes.append(node)
    return r.finish("gptedge untied for QDQ"), wt


def point_gather_at_quantized(model: onnx.ModelProto, wt: str) -> onnx.ModelProto:
    """Make the embedding Gather read the int8 weight the quantizer made for the LM head, then dequantize."""
    inits = {t.name: t for t in model.graph.initializer}
    q_name, s_name = f"{wt}_quantized", f"{wt}_scale"
    if q_name not in inits or s_name not in inits:
        raise QuantizationError("static quantization did not quantize the LM head weight")
    scale = numpy_helper.to_array(inits[s_name])
    nodes: list[onnx.NodeProto] = []
    for node in model.graph.node:
        # The quantizer points every user of the weight at its DequantizeLinear output; a Gather on that
        # would dequantize the whole (C, V) matrix on every run, so it reads the int8 weight instead.
        if node.op_type == "Gather" and node.input[0] in (wt, f"{wt}_DequantizeLinear_Output"):
            ids, mid = node.input[1], node.output[0]
            # (C, B, S) int8
            nodes.append(helper.make_node("Gather", [q_name, ids], [f"{mid}.q"], name=node.name, axis=1))
            nodes.append(helper.make_node("Cast", [f"{mid}.q"], [f"{mid}.f"], name=f"{node.name}.cast",
                                          to=TensorProto.FLOAT))
            if scale.ndim == 0:  # per-tensor
                nodes.append(helper.make_node("Mul", [f"{mid}.f", s_name], [mid], name=f"{node.name}.dequantize"))
            else:  # per vocabulary entry: scale (V,) gathered to (B, S), broadcast over C
                nodes.append(helper.make_node("Gather", [s_name, ids], [f"{mid}.s"], name=f"{node.name}.scale"))
                nodes.append(helper.make_node("Mul", [f"{mid}.f", f"{mid}.s"], [mid], name=f"{node.name}.dequantize"))
        else:
            nodes.append(node)
    used = {i for n in nodes for i in n.input}
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    kept = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return model


class TextCalibrationReader:
    """Feeds prefill windows of real text (empty cache) to ONNX Runtime's calibrator, as the graph
    variant says its graph is fed."""

    def __init__(self, windows: list[list[int]], variant: type[GraphVariant], shape: ModelShape,
                 progress: Callable[[int, int], None] | None = None):
        self.windows, self.variant, self.shape = windows, variant, shape
        self.progress = progress
        self.i = 0

    def get_next(self) -> dict | None:
        if self.i >= len(self.windows):
            return None
        ids = np.array([self.windows[self.i]], dtype=np.int64)
        self.i += 1
        if self.progress:
            self.progress(self.i, len(self.windows))
        return self.variant.calibration_feeds(ids, self.shape)

    def rewind(self) -> None:
        self.i = 0


def calibration_windows(ids: list[int], sequences: int, length: int) -> list[list[int]]:
    """`sequences` windows of `length` tokens spread evenly over the text."""
    if len(ids) < length + 1 or sequences < 1:
        raise QuantizationError(f"calibration text has {len(ids)} tokens; static quantization needs at least "
                                f"{length + 1} (one window of --calibration-length {length})")
    starts = np.linspace(0, len(ids) - length, num=min(sequences, len(ids) - length + 1)).astype(int)
    return [ids[s:s + length] for s in starts]


def quantize_static_qdq(model: onnx.ModelProto, reader: TextCalibrationReader, work_dir: Path,
                        per_channel: bool = True, quantize_attention: bool = False,
                        base_dir: Path | None = None, quantize_head: bool = True) -> onnx.ModelProto:
    """quantize_head False: a task head's linear (its score on the extract state) is left out of the QDQ pass
    and stays a float MatMul (its input's range is still calibrated: nothing reads it)."""
    r = Rewrite(model, base_dir)
    float_head = None if quantize_head else r.head_linear()
    if r.tied_embedding()[2] is None:  # a task head's graph: no LM head to share the embedding with
        r.new_nodes.extend(model.graph.node)  # as it is, its weights inline for the calibrator
        untied, wt = r.finish("gptedge task head for QDQ"), None
    else:
        untied, wt = untie_to_matmul(model, base_dir)
    # the quantizer logs advice meant for image models on the root logger, and its calibration sessions warn
    # about logits_to_keep (an input with a default, on purpose)
    with quiet_logs(ORT_ERROR, {None: logging.ERROR}):
        quantized = _quantize_file(untied, reader, work_dir, per_channel, quantize_attention,
                                   [float_head] if float_head else [])
    return quantized if wt is None else point_gather_at_quantized(quantized, wt)


@contextlib.contextmanager
def _temporary_files_in(work_dir: Path) -> Iterator[None]:
    """quantize_static makes its own temporary directories (the augmented model, shape inference) where
    tempfile points, with no argument to move them: point tempfile at work_dir for the call, so a
    killed run leaves its files inside the partial output directory, nowhere else."""
    saved = tempfile.tempdir
    tempfile.tempdir = str(work_dir)
    try:
        yield
    finally:
        tempfile.tempdir = saved


def _quantize_file(untied: onnx.ModelProto, reader, work_dir: Path, per_channel: bool,
                   quantize_attention: bool, exclude: list[str]) -> onnx.ModelProto:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    # ONNX's own shape inference does not know ONNX Runtime's contrib ops (MultiHeadAttention,
    # SkipLayerNormalization, ...), and the calibrator skips every tensor whose type it does not
    # know: without this, the activations after the first contrib op would stay unquantized.
    untied = SymbolicShapeInference.infer_shapes(untied, auto_merge=True)
    src, dst = work_dir / "untied.onnx", work_dir / "static.onnx"
    save_onnx(untied, src)  # weights in untied.onnx.data when big
    del untied
    with _temporary_files_in(work_dir):
        quantize_static(str(src), str(dst), reader, quant_format=QuantFormat.QDQ, per_channel=per_channel,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
                        calibrate_method=CalibrationMethod.MinMax, nodes_to_exclude=exclude,
                        extra_options={"MatMulConstBOnly": not quantize_attention},
                        calibration_providers=["CPUExecutionProvider"],
                        use_external_data_format=external_data_path(src) is not None)
    return onnx.load(str(dst))


def check(recipe: QuantizeRecipe, shape: ModelShape, calibration_text: str | None) -> None:
    if calibration_text is None:
        raise QuantizationError("static quantization needs --calibration TEXT_FILE")
    if not 2 <= recipe.calibration_length <= shape.context_length:  # the command line is wrong: exit 2
        raise InvalidArgumentError(f"--calibration-length {recipe.calibration_length} is out of range: "
                                f"choose 2..{shape.context_length} (the model's context)")


def apply(job: QuantizeJob) -> Quantized:
    shape, recipe = job.manifest.shape, job.recipe
    ids = encode(load_tokenizer(job.model_dir), job.calibration_text or "")
    windows = bos_first(calibration_windows(ids, recipe.calibration_sequences, recipe.calibration_length),
                        job.manifest)
    if len(windows) < recipe.calibration_sequences:
        log.info("calibration text holds %d windows of %d tokens, not %d: calibrating on %d", len(windows),
                 recipe.calibration_length, recipe.calibration_sequences, len(windows))
    feeds = HeadFeeds(job.manifest.task) if job.manifest.task else variant_class(job.manifest.graph)
    reader = TextCalibrationReader(windows, feeds, shape, job.progress)
    model = quantize_static_qdq(job.model, reader, job.work_dir, recipe.per_channel, recipe.quantize_attention,
                                base_dir=job.model_dir, quantize_head=recipe.quantize_head)
    nodes = {n.name: n.op_type for n in model.graph.node if n.op_type == "QuantizeLinear"}
    return Quantized(model, nodes, dataclasses.replace(recipe, calibration_sequences=len(windows)))


def storage(recipe: QuantizeRecipe) -> Storage:
    scales = "per output channel" if recipe.per_channel else "per tensor"
    return Storage(weights=f"s8 symmetric, {scales} (QDQ)", activations="u8, ranges calibrated on text (QDQ)",
                   embedding_and_lm_head="tied weight stored once as int8 (C, V) QDQ; LM head MatMul, embedding "
                                         "Gather(axis=1) of the same int8 weight")


METHOD = Method(name="static", check=check, apply=apply, storage=storage, quantizes_attention=True)
