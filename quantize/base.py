"""The interface every quantization method module implements (dynamic.py, static.py, weight_only.py, fp16.py).

A method module ends with `METHOD = Method(...)`:

- `check(recipe, shape, calibration_text)`: refuses, in one line and before any work, what the
  method cannot do with this recipe and model (QuantizationError / InvalidArgumentError);
- `apply(job) -> Quantized`: the fp32 graph in, the quantized graph out, with what each node
  became and the recipe as applied (what the manifest records);
- `storage(recipe) -> Storage`: how it stores weights, activations and the tied embedding
  (manifest text);
- `quantizes_attention`: whether --quantize-attention means anything to it.

What a recipe may ask of it (weight widths, asymmetric blocks, fp16 activations) is on its line in
runtime/registry.py, so the recipe is checked without importing onnx.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import onnx

from gptedge.runtime.modeldir.manifest import Manifest, ModelShape
from gptedge.runtime.modeldir.recipe import QuantizeRecipe

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
    # the manifest's `precision` for a recipe: int8 / int4 unless the method says otherwise (fp16)
    precision: Callable[[QuantizeRecipe], str] = lambda recipe: f"int{recipe.bits}"
