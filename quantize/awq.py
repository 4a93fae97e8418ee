"""Activation-aware scaling (AWQ-style, recipe awq): per input channel scales folded into the op before a linear.

For linears y = A W that read an activation A (T, C) which the op making it scales per channel by initializers,
any s > 0 per channel gives the same y in exact arithmetic: those initializers divided by s (along C), W's rows
multiplied by s. The sites (`fold_sites`):
- a normalization's affine: LayerNormalization's gamma and beta, RMSNorm's gamma (SimplifiedLayerNormalization),
  their Skip forms, a Mul by a per-channel initializer (RMSNorm written as plain ops): the norm before the packed
  q / k / v and the one before the MLP's first linear(s);
- a gated MLP's product act(gate) * up, read by down: up's output columns (and its bias, where the MLP has one)
  divided by s. Scaling a column of up scales that column's every block, so up's own rounding does not move.
Quantizing W s instead of W spends the blocks' resolution on the channels whose activations are large (AWQ, Lin et
al. 2023), and at accuracy level 4 the activations A / s that MatMulNBits rounds to int8 per block come out
flatter too (most of an 8-bit layout's error where a gated MLP's product has outliers).

The scales are folded into initializers, not applied by a new Mul before the linear: the graph keeps the same
nodes and ops (the same kernels, no extra pass over the activations), only numbers differ. That is also why a
loaded model cannot show it: `awq` is recorded in the manifest's recipe, but the graph has nothing to check it
against. The other linears (attention's output projection, an ungated MLP's second linear after GELU, a tied LM
head whose weight is also the embedding) have no per-channel op before them to fold into, and keep s = 1.

Per site, s = mean|A|^alpha over the calibration text (normalised to a geometric mean of 1), alpha from ALPHAS
chosen by the site's linears' summed output error on those activations, sum ||A W - Q(A / s) Q(W s)||^2, where Q
of the activations is level 4's per-block int8 rounding when the recipe uses level 4. alpha 0 (s = 1, the plain
quantization) is among the candidates, so the fold never raises that error.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
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
MAX_ROWS = 2048  # activation rows per site used to choose alpha (a seeded share of each calibration window's)


# normalization op -> the inputs that scale its output per channel after normalizing (gamma, beta)
NORM_AFFINE = {"LayerNormalization": (1, 2), "SimplifiedLayerNormalization": (1,),
               "SkipLayerNormalization": (2, 3), "SkipSimplifiedLayerNormalization": (2,)}


@dataclass(frozen=True)
class FoldSite:
    """activation: the tensor (T, C) the linears read; divided: initializers whose last axis is C, divided by s
    for the fold; linears: the MatMuls reading `activation` as input 0, their weights (C, N) multiplied by s."""
    activation: str
    divided: tuple[str, ...]
    linears: tuple[onnx.NodeProto, ...]


def fold_sites(model: onnx.ModelProto, weights: Initializers) -> list[FoldSite]:
    """Every place a per-channel scale folds without touching anything else: the op making the activation scales it
    by initializers no other node reads, and every reader of the activation is a linear (or a Shape) whose 2-D
    weight no other node reads. In graph order, so a later site's `divided` may be an earlier site's linear (up)."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    producer = {o: n for n in model.graph.node for o in n.output}
    outputs = {o.name for o in model.graph.output}

    def own(name: str) -> bool:  # an initializer only one node reads
        return name in weights and len(readers.get(name, [])) == 1

    def linear(n: onnx.NodeProto, act: str) -> bool:
        return (n.op_type == "MatMul" and n.input[0] == act and own(n.input[1])
                and len(weights.shape(n.input[1])) == 2)

    def up_projection(x: str) -> tuple[str, ...]:
        """A gated product's input x -> what divides by s to scale it per channel: the up linear's weight (its
        columns), and its bias where an Add of an initializer follows the MatMul; () if x is no linear's output."""
        node, bias = producer.get(x), ()
        if node is not None and node.op_type == "Add" and len(node.input) == 2:
            for y, b in (node.input, node.input[::-1]):
                if own(b) and y not in outputs and len(readers.get(y, [])) == 1 and y in producer:
                    node, bias = producer[y], (b,)
                    break
        if node is None or not linear(node, node.input[0]):
            return ()
        return (node.input[1], *bias)

    sites = []
    for n in model.graph.node:
        act = n.output[0] if n.output else ""
        divided: tuple[str, ...] = ()
        if n.op_type in NORM_AFFINE:
            divided = tuple(n.input[i] for i in NORM_AFFINE[n.op_type] if i < len(n.input) and n.input[i])
        elif n.op_type == "Mul" and len(n.input) == 2:
            for x in n.input:
                if own(x) and len(weights.shape(x)) == 1:  # RMSNorm's gamma as a plain Mul
                    divided = (x,)
                elif x not in outputs and len(readers.get(x, [])) == 1:
                    divided = up_projection(x)  # act(gate) * up -> down
                if divided:
                    break
        if not divided or act in outputs or not all(own(d) and weights.shape(d) for d in divided):  # 0-D: no C
            continue
        users = readers.get(act, [])
        linears = tuple(u for u in users if u.op_type != "Shape")
        if linears and all(linear(u, act) for u in linears) and all(
                weights.shape(d)[-1] == weights.shape(u.input[1])[0] for d in divided for u in linears):
            sites.append(FoldSite(act, divided, linears))
    return sites


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


def calibration_activations(model_dir: Path, manifest: Manifest, names: list[str], windows: list[np.ndarray],
                            work_dir: Path, max_rows: int | None = None) -> dict[str, np.ndarray]:
    """Run the fp32 graph over the calibration windows with `names` as extra outputs -> name -> (rows, C).
    max_rows: keep about that many rows per name, an equal seeded share of each window's positions, the rest dropped
    as each window is run (every position of every site at once was ~3 GB for a 1B model at the defaults)."""
    session = exposed_session(onnx.load(str(model_dir / manifest.model_file)), names,
                              work_dir / "awq_calibration.onnx")
    rng = np.random.default_rng(0)
    share = None if max_rows is None else -(-max_rows // max(len(windows), 1))
    got: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for ids in windows:
        keep = None
        for n, value in zip(names, session.run(names, window_feeds(session, manifest, ids)), strict=True):
            rows = value.reshape(-1, value.shape[-1])
            if share is not None and len(rows) > share:
                keep = np.sort(rng.choice(len(rows), share, replace=False)) if keep is None else keep
                rows = rows[keep].copy()  # a copy: the window's whole output is not kept alive by a view
            got[n].append(rows)
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


def choose_scale(x: np.ndarray, linears: list[tuple[np.ndarray, int]], recipe: QuantizeRecipe,
                 ) -> tuple[np.ndarray, float, float]:
    """x (T, K) calibration activations, linears [(w (K, N), bits)] reading them -> (s (K,), alpha, the linears'
    summed output error / plain's)."""
    mean_abs = np.maximum(np.abs(x).mean(axis=0), 1e-6)
    refs = [x @ w for w, _ in linears]
    errors = []
    for alpha in ALPHAS:
        s = mean_abs ** alpha
        s = (s / np.exp(np.log(s).mean())).astype(np.float32)  # geometric mean 1: the weights keep their scale
        xs = x / s
        if recipe.accuracy_level == 4:
            xs = activation_blocks_int8(xs, recipe.block_size)
        err = 0.0
        for (w, bits), ref in zip(linears, refs, strict=True):
            wq = dequantized((w * s[:, None]).T, bits, recipe.block_size, recipe.symmetric, recipe.scale_search).T
            err += float(np.square(ref - xs @ wq).sum())
        errors.append((err, alpha, s))
    plain = errors[0][0]
    err, alpha, s = min(errors, key=lambda e: e[0])
    return s, alpha, err / plain if plain > 0 else 1.0


def awq_overrides(model: onnx.ModelProto, recipe: QuantizeRecipe, manifest: Manifest, model_dir: Path,
                  text: str, work_dir: Path) -> dict[str, np.ndarray]:
    """-> new values for the folded initializers by name: each site's divided ones (/ s) and its linears' weights
    (rows * s); weight_only's rewrite reads them instead of the source's. A gated MLP's up weight takes both folds
    (rows by its norm's s, columns by down's), in graph order."""
    weights = Initializers(model, model_dir)
    sites = fold_sites(model, weights)
    if not sites:
        return {}
    budget = recipe.calibration_sequences * recipe.calibration_length
    windows = kv.calibration_ids(model_dir, text, budget, min(manifest.shape.context_length, recipe.calibration_length))
    acts = calibration_activations(model_dir, manifest, [site.activation for site in sites], windows, work_dir,
                                   max_rows=MAX_ROWS)
    neutral = block_linears(manifest.shape.n_layer, manifest.shape.arch)
    scales: dict[str, np.ndarray] = {}
    for site in sites:
        x = acts.pop(site.activation)
        linears = []
        for lin in site.linears:
            base = lin.input[1].removesuffix(".weight")
            kept = kept_at_8bit((base, neutral.get(base, "")), recipe.keep_8bit)
            # the source's weights: an earlier site's fold scales only up's columns, which leaves its rounding alone
            linears.append((weights[lin.input[1]].astype(np.float32), 8 if recipe.bits == 8 or kept else recipe.bits))
        s, alpha, ratio = choose_scale(x.astype(np.float32), linears, recipe)
        log.info("awq %s: alpha %.3f, output error %.3fx the plain quantization's",
                 " + ".join(lin.input[1] for lin in site.linears), alpha, ratio)
        if alpha != 0.0:
            scales[site.activation] = s
    return folded(sites, scales, weights)


def folded(sites: list[FoldSite], scales: dict[str, np.ndarray], weights: Initializers) -> dict[str, np.ndarray]:
    """The fold of per-site scales (activation -> s (C,)): new values by initializer name. In site order, so a gated
    MLP's up weight takes both folds: rows * its norm's s, columns / down's s."""
    out: dict[str, np.ndarray] = {}

    def current(name: str) -> np.ndarray:
        return out[name] if name in out else weights[name].astype(np.float32)

    for site in sites:
        s = scales.get(site.activation)
        if s is None:
            continue
        for name in site.divided:
            out[name] = (current(name) / s).astype(np.float32)  # along the last axis: C
        for lin in site.linears:
            out[lin.input[1]] = (current(lin.input[1]) * s[:, None]).astype(np.float32)
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
