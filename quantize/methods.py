"""Quantization methods: one module each (dynamic.py, weight_only.py, static.py), one entry point each.

fp16.py is the one method that quantizes nothing: it halves every float (GPUs).

A method module ends with `METHOD = Method(...)`:

- `check(recipe, shape, calibration_text)`: refuses, in one line and before any work, what the
  method cannot do with this recipe and model (QuantizationError / InvalidArgumentError);
- `apply(job) -> Quantized`: the fp32 graph in, the quantized graph out, with what each node
  became and the recipe as applied (what the manifest records);
- `storage(recipe) -> Storage`: how it stores weights, activations and the tied embedding
  (manifest text);
- `quantizes_attention`: whether --quantize-attention means anything to it;
- `bits`: the weight widths it can store (the first is the default); `asymmetric`: whether it
  can store 4-bit blocks with their own zero points.

quantizer.py does the rest, the same for every method: guard -> rewrite -> save -> validate,
in an atomic output directory. A new method is one module plus one line in `_registry()`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import onnx

from gptedge.runtime.manifest import Manifest, ModelShape

from .recipe import QuantizeRecipe

@dataclass(frozen=True)
class QuantizeJob:
    model: onnx.ModelProto  # the fp32 graph, weights loaded
    recipe: QuantizeRecipe
    manifest: Manifest  # the fp32 source's
    model_dir: Path  # the fp32 source (tokenizer, for calibration)
    work_dir: Path  # scratch space inside the partial output directory, removed before it is renamed
    calibration_text: str | None = None
    progress: Callable[[int, int], None] | None = None


@dataclass(frozen=True)
class Quantized:
    model: onnx.ModelProto
    nodes: dict[str, str]  # node name -> what it became
    recipe: QuantizeRecipe  # as applied: what the manifest records


@dataclass(frozen=True)
class Storage:
    weights: str
    activations: str
    embedding_and_lm_head: str
    kept_float: str = "position embedding, LayerNorms, biases"


@dataclass(frozen=True)
class Method:
    name: str
    check: Callable[[QuantizeRecipe, ModelShape, str | None], None]
    apply: Callable[[QuantizeJob], Quantized]
    storage: Callable[[QuantizeRecipe], Storage]
    quantizes_attention: bool
    bits: tuple[int, ...] = (8,)
    asymmetric: bool = False
    # the manifest's `precision` for a recipe: int8 / int4 unless the method says otherwise (fp16)
    precision: Callable[[QuantizeRecipe], str] = lambda recipe: f"int{recipe.bits}"
    float16: bool = False  # can also turn the float parts of its graph into fp16 (recipe.float16, for GPUs)


def _registry() -> dict[str, Method]:
    # Imported here: the method modules import QuantizeRecipe, whose validation looks names up here.
    from . import dynamic, fp16, static, weight_only

    return {m.name: m for m in (dynamic.METHOD, static.METHOD, weight_only.METHOD, fp16.METHOD)}


def method_names() -> tuple[str, ...]:
    return tuple(_registry())


def method(name: str) -> Method:
    return _registry()[name]  # the recipe has already refused unknown names
