"""fp16: every float weight and activation in half precision, for GPUs.

ONNX Runtime's CUDA GroupQueryAttention (the kv_buffer graph's attention) runs fp16 / bf16 only,
and half the bytes per weight is half the time of a memory-bound decode step. The pass is ONNX
Runtime's own converter (onnxruntime.transformers.float16), with two choices of ours:

- logits stay float32 (a Cast after the LM head): selection and log-probabilities read float32,
  and (B, 1, V) is tiny next to the weights;
- float constants are clamped to +-1e4, not fp16's +-65504: the additive attention mask holds
  float32's minimum, and a score added to -65504 rounds to -inf in fp16; a padding row whose keys
  are all masked then softmaxes to NaN, and the NaN travels through its cached keys and values.

LayerNorm and softmax need no float32 islands in the graph: ONNX Runtime's CUDA LayerNormalization
and attention kernels accumulate fp16 inputs in float32 internally.

The same pass makes `weight-only --float16` (MatMulNBits blocks with fp16 scales and activations).
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.external_data_helper import load_external_data_for_model

from gptedge.runtime import contract as C
from gptedge.runtime.errors import QuantizationError
from gptedge.runtime.modeldir.manifest import ModelShape
from gptedge.runtime.modeldir.recipe import QuantizeRecipe

from .base import Method, Quantized, QuantizeJob, Storage

log = logging.getLogger(__name__)

FP16_CLAMP = 1.0e4  # |constant| above this becomes +-1e4 (the mask's float32 min); GPT-2 weights are far below
_FLOAT32_MIN = float(np.finfo(np.float32).min)


def _clamped_weights(model: onnx.ModelProto) -> list[str]:
    """Float initializers other than the mask constant that the clamp would change (none in GPT-2)."""
    out = []
    for init in model.graph.initializer:
        if init.data_type != onnx.TensorProto.FLOAT:
            continue
        a = numpy_helper.to_array(init)
        if a.size and float(np.abs(a).max()) > FP16_CLAMP and not np.all(a == _FLOAT32_MIN):
            out.append(init.name)
    return out


def to_float16(model: onnx.ModelProto) -> onnx.ModelProto:
    """The whole graph in fp16 (caches included), logits float32. Raises for a weight fp16 cannot hold."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    too_big = _clamped_weights(model)
    if too_big:
        raise QuantizationError(f"fp16 would clamp weights above {FP16_CLAMP:g} in {', '.join(too_big[:3])}")
    half = convert_float_to_float16(model, max_finite_val=FP16_CLAMP, keep_io_types=[C.LOGITS],
                                    disable_shape_infer=True)
    half.producer_name = "gptedge"
    return half


def check(recipe: QuantizeRecipe, shape: ModelShape, calibration_text: str | None) -> None:
    """Nothing to refuse: every float graph converts."""


def apply(job: QuantizeJob) -> Quantized:
    """The quantizer hands over the graph without its external weights: they are read in here (the fp32
    weights and their fp16 halves are held together at the peak, 1.5x the fp32 file)."""
    load_external_data_for_model(job.model, str(job.model_dir))
    floats = [i.name for i in job.model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT]
    return Quantized(to_float16(job.model), {name: "float16 weight" for name in floats}, job.recipe)


def storage(recipe: QuantizeRecipe) -> Storage:
    return Storage(weights="float16 (every linear weight, bias and LayerNorm parameter)",
                   activations=ACTIVATIONS, embedding_and_lm_head="tied weight stored once in float16",
                   kept_float="the logits output only (float32)")


ACTIVATIONS = ("float16, caches included; LayerNorm and attention softmax accumulate in float32 inside ONNX "
               "Runtime's kernels; logits cast to float32")

METHOD = Method(name="fp16", check=check, apply=apply, storage=storage, quantizes_attention=False,
                precision=lambda recipe: "fp16")
