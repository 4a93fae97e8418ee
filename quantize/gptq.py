"""Second-order rounding (GPTQ-style, recipe gptq) of MatMulNBits' blocks, in the plain recipe's layout. Pure numpy.

For a linear y = x W (x: (T, K) activations at its input over the calibration text, W: (K, N)), rounding W's
K rows one at a time and moving each one's rounding error onto the rows not yet rounded, weighted by the inverse
of H = 2 X^T X, minimises ||X W - X Q(W)||^2 far better than rounding each weight to its nearest level
(Optimal Brain Quantization as GPTQ runs it, Frantar et al. 2022): with U the upper Cholesky factor of
H^-1 (H^-1 = U^T U), rounding row j of W to q_j leaves the error e = (w_j - q_j) / U[j, j], and every later row
j' takes w_j' -= e U[j, j']. Updates are applied lazily, one MatMulNBits block of K at a time (the rows inside
the block at once, the rest of W by one matmul per block), as GPTQ's reference does. H is dampened by
PERCDAMP x its mean diagonal (a few near-dead input channels would make it singular); its factor 2 and the
number of tokens cancel out of the updates, so H here is X^T X / T.

Where the grid comes from: MatMulNBits stores one scale (and, 4-bit asymmetric, one zero point) per block of
`block_size` consecutive K for each output column. The default chooses each block's grid when the pass reaches
it, from the weights as the earlier blocks' errors left them (the plain search, or --scale-search mse, run on the
updated block), then rounds its K one by one on that grid. `static_scales` instead fixes every block's grid
from the original weights first.

Act-order (rounding K in order of decreasing H diagonal) is legal with this layout only with static scales:
MatMulNBits' blocks are consecutive K (a g_idx input that regroups K is not written: other bytes, and not every
kernel takes it), so a block's grid must exist before its first K is reached in whatever order; `act_order`
therefore implies `static_scales`. Both are off by default: benchmarks/results/quantizers-2026-11-26b.md measured
which pays.

The tied embedding / LM head is not touched (the embedding reads the same blocks, and GPTQ's errors are chosen
for the head's inputs only); every other linear MatMul is, whatever layout the checkpoint stored it in (the graph
holds every linear as a (K, N) MatMul initializer).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import logging
from pathlib import Path

import numpy as np
import onnx

from gptedge.runtime.modeldir.manifest import Manifest
from gptedge.runtime.modeldir.recipe import QuantizeRecipe, kept_at_8bit

from . import int8_math as qm
from . import kv_cache as kv
from . import nbit_math as nm
from .awq import exposed_session, window_feeds, with_overrides
from .rewrite import Rewrite

log = logging.getLogger(__name__)

PERCDAMP = 0.01  # dampening: this fraction of H's mean diagonal added to its diagonal (GPTQ's default)
# The float32 Hessians held at once: linears whose inputs' K x K matrices exceed it are measured in further passes
# over the calibration windows (GPT-2 small: ~0.5 GB for all twelve blocks, one pass; GPT-2 XL: ~9 GB, ~10 passes).
HESSIAN_BYTES = 1 << 30
# The variants gptq_blocks runs (see above; benchmarks/run_gptq.sh measures the others by setting these).
ACT_ORDER = False
STATIC_SCALES = False


def _grid(block: np.ndarray, bits: int, symmetric: bool, scale_search: str) -> tuple[np.ndarray, np.ndarray]:
    """One block of K for every output column, (N, bs) -> (scale (N,), zero point (N,)) as the plain recipe (or
    --scale-search mse) would choose them for these weights."""
    if bits == 8:
        _, scale = qm.quantize_blocks_u8(block, block.shape[1], scale_search)  # zero point 128
        return scale[:, 0].astype(np.float64), np.full(block.shape[0], 128.0)
    _, scale, zp = nm.grid_4bit(block[:, None, :].astype(np.float32), symmetric, scale_search=scale_search)
    return scale[:, 0].astype(np.float64), zp[:, 0].astype(np.float64)


def _levels(bits: int) -> tuple[int, int]:
    return (128 - qm.QMAX, 128 + qm.QMAX) if bits == 8 else (0, nm.LEVELS - 1)


@dataclasses.dataclass(frozen=True)
class InverseFactor:
    """What GPTQ needs of one input's H, whichever linears read that input: `dead` (K,) bool, the channels the
    calibration never moved; `order` (K,) the order K is rounded in; `u` (K, K) float64, the upper Cholesky factor
    of the dampened H^-1 (rows and columns in `order`)."""
    dead: np.ndarray
    order: np.ndarray
    u: np.ndarray


def inverse_factor(hessian: np.ndarray, act_order: bool = False, percdamp: float = PERCDAMP) -> InverseFactor:
    """H (K, K) of a linear's input -> its InverseFactor: the O(K^3) part of GPTQ, equal for every linear (and every
    recipe) that reads the same input on the same calibration windows."""
    h = np.array(hessian, np.float64)
    k = h.shape[0]
    dead = np.diag(h) == 0  # an input channel the calibration never moved: its weights cannot matter there
    h[dead, dead] = 1.0
    order = np.argsort(-np.diag(h), kind="stable") if act_order else np.arange(k)
    h = h[np.ix_(order, order)]
    h[np.diag_indices(k)] += percdamp * np.mean(np.diag(h))
    return InverseFactor(dead, order, np.linalg.cholesky(np.linalg.inv(h)).T)  # upper: H^-1 = U^T U


def gptq_rows(w_rows: np.ndarray, hessian: np.ndarray | None, bits: int, block_size: int, symmetric: bool = False,
              scale_search: str = "range", act_order: bool = False, static_scales: bool = False,
              percdamp: float = PERCDAMP, factor: InverseFactor | None = None,
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows (N, K) of a linear (the transpose of its (K, N) MatMul weight) and H (K, K) of its input (or its
    InverseFactor, made with the same act_order and percdamp) -> (levels (N, K/bs, bs) float, scales (N, K/bs)
    float32, zero points (N, K/bs) float), the arrays the plain recipe packs."""
    n, k = w_rows.shape
    if k % block_size:
        raise ValueError(f"K={k} is not a multiple of block size {block_size}")
    lo, hi = _levels(bits)
    if factor is None:
        factor = inverse_factor(hessian, act_order, percdamp)
    w = w_rows.T.astype(np.float64)  # (K, N), a copy updated in place: row j is what input channel j multiplies
    w[factor.dead] = 0.0
    n_blocks = k // block_size
    scale, zp = np.ones((n_blocks, n)), np.zeros((n_blocks, n))  # per block of K, per output column
    static = static_scales or act_order
    if static:
        for b in range(n_blocks):
            scale[b], zp[b] = _grid(w[b * block_size:(b + 1) * block_size].T, bits, symmetric, scale_search)
    order, u = factor.order, factor.u
    w = w[order]
    levels = np.zeros((k, n))
    for i1 in range(0, k, block_size):  # one lazy batch per block of K (natural order: exactly one MatMulNBits block)
        i2 = i1 + block_size
        w1 = w[i1:i2]  # (bs, N), a view: the updates inside the batch land in w
        if not static:  # this block's grid, from the weights the earlier blocks' errors have moved
            b = order[i1] // block_size
            scale[b], zp[b] = _grid(w1.T, bits, symmetric, scale_search)
        err = np.zeros((block_size, n))
        for i in range(block_size):
            j = i1 + i
            b = order[j] // block_size
            q = np.clip(np.rint(w1[i] / scale[b]) + zp[b], lo, hi)
            levels[order[j]] = q
            err[i] = (w1[i] - (q - zp[b]) * scale[b]) / u[j, j]
            w1[i:] -= u[j, j:i2, None] * err[i]
        w[i2:] -= u[i1:i2, i2:].T @ err
    return levels.T.reshape(n, n_blocks, block_size), scale.T.astype(np.float32), zp.T


def packed(levels: np.ndarray, scale: np.ndarray, zp: np.ndarray, bits: int, symmetric: bool) -> tuple:
    """gptq_rows' result -> MatMulNBits' initializers, as weight_only writes them: 8-bit (q uint8, scales);
    4-bit (packed q, scales, packed zero points or None)."""
    if bits == 8:
        return levels.astype(np.uint8), scale
    return nm.pack_levels(levels, scale, zp, symmetric)


def hessians(model: onnx.ModelProto, manifest: Manifest, inputs: list[str], windows: list[np.ndarray],
             work_dir: Path) -> dict[str, np.ndarray]:
    """Run the float `model` over the calibration windows with `inputs` (linears' input values) exposed ->
    name -> X^T X / T (K, K) float32, X the (T, K) values over every window's tokens."""
    session = exposed_session(model, inputs, work_dir / "gptq_calibration.onnx")
    h: dict[str, np.ndarray] = {}
    tokens = 0
    for ids in windows:
        for name, value in zip(inputs, session.run(inputs, window_feeds(session, manifest, ids)), strict=True):
            x = value.reshape(-1, value.shape[-1]).astype(np.float32)  # (T, K)
            h[name] = h[name] + x.T @ x if name in h else x.T @ x
        tokens += int(ids.size)
    return {name: m / np.float32(tokens) for name, m in h.items()}  # float32: gptq_rows takes each to float64


# Set by `factor_cache` for a recipe search: the folder that keeps each input's InverseFactor between candidates.
_FACTOR_FOLDER: contextvars.ContextVar[Path | None] = contextvars.ContextVar("gptq_factor_folder", default=None)


@contextlib.contextmanager
def factor_cache(folder: Path):
    """Within the block, gptq_blocks keeps every input's InverseFactor in `folder` (float64 (K, K) each: ~1 GB for
    GPT-2 small, on disk, not in memory) and reads it back when the same float model, calibration text, windows
    and input come again: --max-kl's GPTQ candidates differ in bits, grids and kept linears, never in H, so the
    Hessian pass and the K^3 factorisations (about two thirds of one candidate's time on GPT-2 small) run once."""
    folder.mkdir(parents=True, exist_ok=True)
    token = _FACTOR_FOLDER.set(folder)
    try:
        yield folder
    finally:
        _FACTOR_FOLDER.reset(token)


def _run_key(model_dir: Path, text: str, windows: list[np.ndarray]):
    """What every input's H of this run depends on, hashed once (copy() it per input)."""
    key = hashlib.sha256()
    for part in (str(model_dir.resolve()), text, str(ACT_ORDER), str(PERCDAMP)):
        key.update(part.encode("utf-8", "surrogatepass") + b"\0")
    for ids in windows:
        key.update(ids.tobytes())
    return key


def _factor_path(folder: Path, run_key, input_name: str) -> Path:
    key = run_key.copy()
    key.update(input_name.encode("utf-8", "surrogatepass"))
    return folder / f"{key.hexdigest()[:32]}.npz"


def _load_factor(path: Path) -> InverseFactor | None:
    if not path.exists():
        return None
    with np.load(path) as z:
        return InverseFactor(z["dead"], z["order"], z["u"])


def _save_factor(path: Path, f: InverseFactor) -> None:
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, dead=f.dead, order=f.order, u=f.u)
    tmp.replace(path)


def gptq_blocks(model: onnx.ModelProto, recipe: QuantizeRecipe, manifest: Manifest, model_dir: Path, text: str,
                work_dir: Path, overrides: dict[str, np.ndarray] | None,
                linear_names: dict[str, str]) -> dict[str, tuple]:
    """-> every linear MatMul's MatMulNBits initializers by weight name (packed), rounded by GPTQ on the
    activations at its input over the calibration text; weight_only's rewrite writes them in place of its own.
    overrides: awq's folded initializers (the fold's weights, and the activations its LayerNorms give)."""
    r = Rewrite(model, model_dir)
    float_head = None if recipe.quantize_head else r.head_linear()
    linears = [node for node in model.graph.node if r.is_linear(node) and node.name != float_head]
    if not linears:
        return {}
    float_model = with_overrides(model, overrides or {}, model_dir)  # every initializer inline
    budget = recipe.calibration_sequences * recipe.calibration_length
    windows = kv.calibration_ids(model_dir, text, budget, min(manifest.shape.context_length,
                                                              recipe.calibration_length))
    by_input: dict[str, list[onnx.NodeProto]] = {}
    for node in linears:  # linears reading one input (separate q / k / v projections) share one H
        by_input.setdefault(node.input[0], []).append(node)
    folder = _FACTOR_FOLDER.get() if not overrides else None  # awq's overrides change the activations: no reuse
    factors: dict[str, InverseFactor] = {}
    paths: dict[str, Path] = {}
    if folder is not None:
        run_key = _run_key(model_dir, text, windows)
        for name in by_input:
            paths[name] = _factor_path(folder, run_key, name)
            cached = _load_factor(paths[name])
            if cached is not None:
                factors[name] = cached
    needed = [name for name in by_input if name not in factors]
    groups, size = [[]], 0
    for name in needed:
        k = r.weights.shape(by_input[name][0].input[1])[0]
        if groups[-1] and size + 4 * k * k > HESSIAN_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += 4 * k * k
    out: dict[str, tuple] = {}

    def round_input(name: str, factor: InverseFactor) -> None:
        for node in by_input[name]:
            weight = node.input[1]
            w = (overrides or {}).get(weight)
            w = r.weights[weight] if w is None else w  # (K, N)
            graph_name = weight.removesuffix(".weight")
            bits = 8 if recipe.bits == 8 or kept_at_8bit((graph_name, linear_names.get(graph_name, graph_name)),
                                                         recipe.keep_8bit) else recipe.bits
            levels, scale, zp = gptq_rows(w.T, None, bits, recipe.block_size, recipe.symmetric,
                                          recipe.scale_search, ACT_ORDER, STATIC_SCALES, factor=factor)
            out[weight] = packed(levels, scale, zp, bits, recipe.symmetric)
            log.debug("gptq %s: %d-bit, K=%d N=%d", weight, bits, *w.shape)

    for name, factor in factors.items():
        round_input(name, factor)
    for group in groups if needed else []:
        h = hessians(_copy(float_model), manifest, group, windows, work_dir)
        for name in group:
            factor = inverse_factor(h.pop(name), ACT_ORDER)
            if folder is not None:
                _save_factor(paths[name], factor)
            round_input(name, factor)
    log.info("gptq: %d linears rounded on %d calibration windows (%d of %d inputs' factors reused)", len(linears),
             len(windows), len(factors), len(by_input))
    return out


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out
