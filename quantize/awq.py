"""Activation-aware scaling (AWQ-style, recipe awq): per input channel scales folded into the LayerNorm before a linear.

For a linear y = LN(x) W whose input is a LayerNorm's output alone (GPT-2: ln_1 -> attn.c_attn,
ln_2 -> mlp.c_fc), any s > 0 per input channel gives the same y in exact arithmetic:
LN's gamma and beta divided by s, W's rows multiplied by s. Quantizing W s instead of W spends the
blocks' resolution on the channels whose activations are large (AWQ, Lin et al. 2023), and at
accuracy level 4 the activations LN(x) / s that MatMulNBits quantizes per block come out flatter too.

The scales are folded into gamma / beta, not applied by a new Mul before the linear: the graph keeps
the same nodes and ops (the same kernels, no extra pass over the activations), only numbers differ.
That is also why a loaded model cannot show it: `awq` is recorded in the manifest's recipe, but the
graph has nothing to check it against (a LayerNorm's gamma says nothing about how it was chosen).
The other linears (attention's c_proj after attention, the MLP's c_proj after GELU, the tied LM head
whose weight is also the embedding) have no affine op before them to fold into, and keep s = 1.

Per linear, s = mean|LN(x)|^alpha over the calibration text (normalised to a geometric mean of 1),
alpha from ALPHAS chosen by the linear's output error on those activations, ||X W - Q(X / s) Q(W s)||^2,
where Q of the activations is level 4's per-block int8 rounding when the recipe uses level 4. alpha 0
(s = 1, the plain quantization) is among the candidates, so the fold never raises that error.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from gptedge.onnx_files import Initializers
from gptedge.runtime.graphs.graph_variant import variant_class
from gptedge.runtime.modeldir.manifest import Manifest
from gptedge.runtime.modeldir.recipe import QuantizeRecipe, block_linears, kept_at_8bit

from . import int8_math as qm
from . import kv_cache as kv
from . import nbit_math as nm

log = logging.getLogger(__name__)

ALPHAS = (0.0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0)
MAX_ROWS = 2048  # activation rows per linear used to choose alpha (a seeded sample of the calibration tokens)


def ln_linear_pairs(model: onnx.ModelProto, weights: Initializers) -> list[tuple[onnx.NodeProto, onnx.NodeProto]]:
    """(LayerNormalization, the linear MatMul that is its output's only reader), where the LayerNorm's gamma and beta
    are initializers that no other node reads: where a per-channel scale folds without touching anything else."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    outputs = {o.name for o in model.graph.output}
    pairs = []
    for ln in model.graph.node:
        if ln.op_type != "LayerNormalization" or len(ln.input) < 3 or ln.output[0] in outputs:
            continue
        users = readers.get(ln.output[0], [])
        if len(users) != 1 or users[0].op_type != "MatMul" or users[0].input[0] != ln.output[0]:
            continue
        lin = users[0]
        if lin.input[1] not in weights or len(weights.shape(lin.input[1])) != 2:
            continue
        if all(p in weights and len(readers[p]) == 1 for p in ln.input[1:3]):
            pairs.append((ln, lin))
    return pairs


def exposed_session(model: onnx.ModelProto, names: list[str], path: Path):
    """An ONNX Runtime session of the float `model` (initializers inline or beside `path`) with the intermediate
    values `names` also as graph outputs, saved at `path` (a scratch file) first."""
    import onnxruntime as ort

    model.graph.output.extend(helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in names)
    onnx.save(model, str(path), save_as_external_data=True, location=path.name + ".data")
    options = ort.SessionOptions()
    options.log_severity_level = 3  # ORT warns that logits_to_keep is an input with a default: noise to users
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


def window_feeds(session, manifest: Manifest, ids: np.ndarray) -> dict[str, np.ndarray]:
    """The graph's inputs for one calibration window (1, T) of token ids, as its variant feeds them."""
    wanted = {i.name for i in session.get_inputs()}
    return {k: v for k, v in variant_class(manifest.graph).calibration_feeds(ids, manifest.shape).items()
            if k in wanted}


def layer_norm_outputs(model_dir: Path, manifest: Manifest, names: list[str], windows: list[np.ndarray],
                       work_dir: Path) -> dict[str, np.ndarray]:
    """Run the fp32 graph over the calibration windows with `names` as extra outputs -> name -> (tokens, C)."""
    session = exposed_session(onnx.load(str(model_dir / manifest.model_file)), names,
                              work_dir / "awq_calibration.onnx")
    got: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for ids in windows:
        for n, value in zip(names, session.run(names, window_feeds(session, manifest, ids)), strict=True):
            got[n].append(value.reshape(-1, value.shape[-1]))
    return {n: np.concatenate(v) for n, v in got.items()}


def dequantized(w_rows: np.ndarray, bits: int, block_size: int, symmetric: bool, scale_search: str) -> np.ndarray:
    """Rows (N, K) -> what MatMulNBits computes with after weight_only's quantization, (N, K) float32."""
    if bits == 8:
        return qm.dequantize_blocks_u8(*qm.quantize_blocks_u8(w_rows, block_size, scale_search))
    return nm.dequantize_4bit(*nm.quantize_4bit(w_rows, block_size, symmetric, scale_search=scale_search))


def activation_blocks_int8(x: np.ndarray, block_size: int) -> np.ndarray:
    """Accuracy level 4's activations: each row's blocks of `block_size` along K rounded to int8, |max| / 127."""
    t, k = x.shape
    b = x.reshape(t, k // block_size, block_size)
    scale = np.abs(b).max(axis=-1, keepdims=True) / 127.0
    scale = np.where(scale == 0, 1.0, scale)
    return (np.rint(b / scale) * scale).reshape(t, k).astype(np.float32)


def choose_scale(x: np.ndarray, w: np.ndarray, bits: int, recipe: QuantizeRecipe) -> tuple[np.ndarray, float, float]:
    """x (T, K) calibration activations, w (K, N) -> (s (K,), alpha, output error / plain's error)."""
    mean_abs = np.maximum(np.abs(x).mean(axis=0), 1e-6)
    ref = x @ w
    errors = []
    for alpha in ALPHAS:
        s = mean_abs ** alpha
        s = (s / np.exp(np.log(s).mean())).astype(np.float32)  # geometric mean 1: the weights keep their scale
        wq = dequantized((w * s[:, None]).T, bits, recipe.block_size, recipe.symmetric, recipe.scale_search).T
        xs = x / s
        if recipe.accuracy_level == 4:
            xs = activation_blocks_int8(xs, recipe.block_size)
        errors.append((float(np.square(ref - xs @ wq).sum()), alpha, s))
    plain = errors[0][0]
    err, alpha, s = min(errors, key=lambda e: e[0])
    return s, alpha, err / plain if plain > 0 else 1.0


def awq_overrides(model: onnx.ModelProto, recipe: QuantizeRecipe, manifest: Manifest, model_dir: Path,
                  text: str, work_dir: Path) -> dict[str, np.ndarray]:
    """-> new values for the folded initializers: each LayerNorm's gamma / beta (divided by s) and its linear's
    weight (rows multiplied by s), by initializer name; weight_only's rewrite reads them instead of the source's."""
    weights = Initializers(model, model_dir)
    pairs = ln_linear_pairs(model, weights)
    if not pairs:
        return {}
    budget = recipe.calibration_sequences * recipe.calibration_length
    windows = kv.calibration_ids(model_dir, text, budget, min(manifest.shape.context_length, recipe.calibration_length))
    acts = layer_norm_outputs(model_dir, manifest, [ln.output[0] for ln, _ in pairs], windows, work_dir)
    rng = np.random.default_rng(0)
    out: dict[str, np.ndarray] = {}
    neutral = block_linears(manifest.shape.n_layer, manifest.shape.arch)
    for ln, lin in pairs:
        x = acts.pop(ln.output[0])
        if len(x) > MAX_ROWS:
            x = x[np.sort(rng.choice(len(x), MAX_ROWS, replace=False))]
        name = lin.input[1]
        names = (name.removesuffix(".weight"), neutral.get(name.removesuffix(".weight"), ""))
        bits = 8 if recipe.bits == 8 or kept_at_8bit(names, recipe.keep_8bit) else recipe.bits
        w = weights[name].astype(np.float32)
        s, alpha, ratio = choose_scale(x.astype(np.float32), w, bits, recipe)
        log.info("awq %s: alpha %.3f, output error %.3fx the plain quantization's", name, alpha, ratio)
        if alpha == 0.0:
            continue
        gamma, beta = ln.input[1], ln.input[2]
        out[gamma] = (weights[gamma] / s).astype(np.float32)
        out[beta] = (weights[beta] / s).astype(np.float32)
        out[name] = (w * s[:, None]).astype(np.float32)
    return out


def with_overrides(model: onnx.ModelProto, overrides: dict[str, np.ndarray], base_dir: Path | None) -> onnx.ModelProto:
    """A copy of the float model with those initializers replaced (every initializer inline): the fold, unquantized."""
    weights = Initializers(model, base_dir)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.initializer[:]
    for t in model.graph.initializer:
        out.graph.initializer.append(numpy_helper.from_array(overrides[t.name], t.name) if t.name in overrides
                                     else weights.inline_copy(t.name))
    return out
