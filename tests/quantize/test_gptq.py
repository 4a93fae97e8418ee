"""GPTQ-style rounding (--gptq, quantize/gptq.py): the numpy rounding against a hand-written reference loop (OBQ's
row-by-row updates of H^-1, no Cholesky, no lazy batches) on a tiny seeded linear; what it buys there (the
linear's output error) and on a tiny model (KL on held-out text); the dir's layout and the manifest's record."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import numpy_helper
import pytest
from click.testing import CliRunner

from gptedge.cli import main
from gptedge.quantize import gptq
from gptedge.quantize import int8_math as qm
from gptedge.quantize import nbit_math as nm
from gptedge.quantize.quantizer import QuantizeRecipe, quantize_model_dir
from gptedge.quantize.recipe_search import _Scorer
from gptedge.runtime import load
from gptedge.runtime.errors import InvalidArgumentError
from gptedge.runtime.modeldir.manifest import MANIFEST_NAME, read_manifest

from ..support.checkpoints import ROOT

CALIBRATION = ROOT / "samples" / "calibration" / "emma_ch1-4.txt"
HELD_OUT = (ROOT / "samples" / "eval" / "persuasion_ch1-7.txt").read_text(encoding="utf-8")[:6000]


def seeded_linear(k=96, n=24, t=512, seed=0) -> tuple[np.ndarray, np.ndarray]:
    """-> (activations X (T, K) with correlated channels and one outlier channel, weight rows (N, K))."""
    rng = np.random.default_rng(seed)
    mix = np.eye(k) + 0.4 * rng.standard_normal((k, k)) / np.sqrt(k)
    x = (rng.standard_normal((t, k)) @ mix).astype(np.float32)
    x[:, 7] *= 6
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    return x, w


def reference_gptq(w_rows, h, bits, block_size, symmetric, scale_search, percdamp=gptq.PERCDAMP):
    """The textbook loop (Frantar et al. 2022, eq. 2-3): round K one at a time in natural order; spread each error
    over the later K by H^-1's row; remove the rounded K from H^-1 (its Schur complement). A block's grid is chosen
    when its first K is reached, from the weights as updated so far. -> dequantized rows (N, K)."""
    n, k = w_rows.shape
    w = w_rows.astype(np.float64).copy()
    h = h.astype(np.float64) + percdamp * np.mean(np.diag(h)) * np.eye(k)
    hinv = np.linalg.inv(h)
    out = np.zeros_like(w)
    for j in range(k):
        if j % block_size == 0:
            block = w[:, j:j + block_size].astype(np.float32)
            if bits == 8:
                scale, zp, lo, hi = qm.quantize_blocks_u8(block, block_size, scale_search)[1][:, 0], 128.0, 1, 255
            else:
                _, scale, zp = nm.grid_4bit(block[:, None, :], symmetric, scale_search=scale_search)
                scale, zp, lo, hi = scale[:, 0], zp[:, 0], 0, 15
        q = np.clip(np.rint(w[:, j] / scale) + zp, lo, hi)
        out[:, j] = (q - zp) * scale
        err = (w[:, j] - out[:, j]) / hinv[j, j]
        w[:, j + 1:] -= np.outer(err, hinv[j, j + 1:])
        hinv -= np.outer(hinv[:, j], hinv[j, :]) / hinv[j, j]  # the rounded K leaves H^-1 (rows / cols j now 0)
    return out


def dequantized(levels, scale, zp):
    return ((levels - zp[..., None]) * scale[..., None]).reshape(levels.shape[0], -1)


@pytest.mark.parametrize("bits, symmetric, scale_search", [(4, False, "range"), (4, True, "mse"), (8, True, "range")])
def test_gptq_equals_the_reference_loop(bits, symmetric, scale_search):
    x, w = seeded_linear()
    h = x.T.astype(np.float64) @ x / len(x)
    got = dequantized(*gptq.gptq_rows(w, h, bits, 32, symmetric, scale_search))
    want = reference_gptq(w, h, bits, 32, symmetric, scale_search)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("bits, gain", [(4, 0.8), (8, 0.8)])
def test_gptq_lowers_the_linears_output_error_in_the_plain_layout(bits, gain):
    """||X (W - Q)||^2 well under round-to-nearest on the same kind of grid; the arrays pack into the plain
    recipe's shapes and types and dequantize to the same weights."""
    x, w = seeded_linear(seed=1)
    h = x.T.astype(np.float64) @ x / len(x)
    for variant in ({}, {"static_scales": True}, {"act_order": True}):
        levels, scale, zp = gptq.gptq_rows(w, h, bits, 32, False if bits == 4 else True, **variant)
        ours = dequantized(levels, scale, zp)
        stored = gptq.packed(levels, scale, zp, bits, bits == 8)
        if bits == 4:
            plain_arrays = nm.quantize_4bit(w, 32, False)
            plain = nm.dequantize_4bit(*plain_arrays)
            np.testing.assert_allclose(nm.dequantize_4bit(*stored), ours, atol=1e-6)
        else:
            plain_arrays = qm.quantize_blocks_u8(w, 32)
            plain = qm.dequantize_blocks_u8(*plain_arrays)
            np.testing.assert_allclose(qm.dequantize_blocks_u8(*stored), ours, atol=1e-6)
        assert [(a.shape, a.dtype) for a in stored] == [(a.shape, a.dtype) for a in plain_arrays]
        error = float(np.square(x @ (ours - w).T).sum())
        assert error < gain * float(np.square(x @ (plain - w).T).sum()), variant


def test_a_dead_input_channel_is_zeroed_not_divided_by():
    x, w = seeded_linear(seed=2)
    x[:, 40] = 0.0
    levels, scale, zp = gptq.gptq_rows(w, x.T.astype(np.float64) @ x / len(x), 4, 32, False)
    deq = dequantized(levels, scale, zp)
    assert np.isfinite(deq).all() and np.abs(deq[:, 40]).max() <= np.abs(scale[:, 1]).max()  # its level: ~0


def test_the_recipe_refuses_gptq_outside_weight_only():
    with pytest.raises(InvalidArgumentError, match="--gptq applies to weight-only"):
        QuantizeRecipe("dynamic", gptq=True)


@pytest.mark.slow  # two quantized dirs of the tiny model, scored on held-out text
def test_gptq_dir_beats_plain_on_held_out_text_and_says_so(gpt2_model_dir, tmp_path):
    """Calibrated on Emma, scored on Persuasion: KL(fp32 || gptq) <= KL(fp32 || plain), same graph and bytes; the
    manifest records it, and a manifest written before the field reads as without it."""
    runner = CliRunner()
    base = ["quantize", str(gpt2_model_dir), "--method", "weight-only", "--bits", "4"]
    plain = runner.invoke(main, [*base, "-o", str(tmp_path / "plain")])  # reads no text: --calibration is refused
    result = runner.invoke(main, [*base, "-o", str(tmp_path / "gptq"), "--gptq", "--calibration", str(CALIBRATION),
                                  "--calibration-sequences", "8"])
    assert plain.exit_code == 0 and result.exit_code == 0, result.output
    assert "embedding 8-bit, gptq)" in result.output
    scorer = _Scorer(load(gpt2_model_dir, device="cpu"), HELD_OUT)
    kl_plain, kl_gptq = scorer.kl(tmp_path / "plain"), scorer.kl(tmp_path / "gptq")
    assert kl_gptq < kl_plain, (kl_gptq, kl_plain)
    graphs = [onnx.load(str(tmp_path / d / "model.onnx")) for d in ("plain", "gptq")]
    assert [n.op_type for n in graphs[0].graph.node] == [n.op_type for n in graphs[1].graph.node]
    layouts = [{(t.name, t.data_type, tuple(t.dims)) for t in g.graph.initializer} for g in graphs]
    assert layouts[0] == layouts[1]  # the same initializers, shapes and types: the same bytes
    q = json.loads((tmp_path / "gptq" / MANIFEST_NAME).read_text())["quantization"]
    assert q["gptq"] is True and "GPTQ" in q["weights"]
    assert read_manifest(tmp_path / "gptq").quantization.label.endswith(", gptq")
    path = tmp_path / "plain" / MANIFEST_NAME
    data = json.loads(path.read_text())
    del data["quantization"]["gptq"]
    path.write_text(json.dumps(data))
    assert read_manifest(tmp_path / "plain").quantization.gptq is False


def test_gptq_needs_a_calibration_text(gpt2_model_dir, tmp_path):
    result = CliRunner().invoke(main, ["quantize", str(gpt2_model_dir), "-o", str(tmp_path / "x"), "--method",
                                       "weight-only", "--gptq"])
    assert result.exit_code == 2 and "--gptq needs --calibration TEXT_FILE" in result.output
    assert not (tmp_path / "x").exists()
    with pytest.raises(InvalidArgumentError, match="--gptq needs --calibration"):
        quantize_model_dir(gpt2_model_dir, tmp_path / "y", QuantizeRecipe("weight-only", gptq=True))


@pytest.mark.slow  # two AWQ searches and one GPTQ pass through the command, scored on held-out text
def test_gptq_rounds_the_awq_scaled_weights(gpt2_model_dir, tmp_path):
    """--awq --gptq: AWQ's scales are folded first (the same LayerNorms as --awq alone) and GPTQ then rounds the
    scaled weights (other MatMulNBits bytes than --awq alone), scored on held-out text no worse than --awq alone;
    the manifest records both."""
    runner = CliRunner()
    base = ["quantize", str(gpt2_model_dir), "--method", "weight-only", "--bits", "4", "--awq",
            "--calibration", str(CALIBRATION), "--calibration-sequences", "8"]
    for name, extra in (("awq", []), ("both", ["--gptq"])):
        result = runner.invoke(main, [*base, "-o", str(tmp_path / name), *extra])
        assert result.exit_code == 0, result.output
    assert "awq, gptq)" in result.output
    q = json.loads((tmp_path / "both" / MANIFEST_NAME).read_text())["quantization"]
    assert q["awq"] is True and q["gptq"] is True
    graphs = {d: onnx.load(str(tmp_path / d / "model.onnx")) for d in ("awq", "both")}
    inits = {d: {t.name: numpy_helper.to_array(t) for t in g.graph.initializer} for d, g in graphs.items()}
    norms = [n for n in inits["awq"] if n.endswith(("ln_1.weight", "ln_2.weight"))]
    assert len(norms) == 4 and all(np.array_equal(inits["awq"][n], inits["both"][n]) for n in norms)
    packed = [n for n in inits["awq"] if inits["awq"][n].dtype == np.uint8 and ".h." in f".{n}"]
    assert packed and any(not np.array_equal(inits["awq"][n], inits["both"][n]) for n in packed), \
        "--gptq was ignored beside --awq: every block's weights are --awq's alone"
    scorer = _Scorer(load(gpt2_model_dir, device="cpu"), HELD_OUT)
    kl_awq, kl_both = scorer.kl(tmp_path / "awq"), scorer.kl(tmp_path / "both")
    assert kl_both <= kl_awq, (kl_both, kl_awq)
