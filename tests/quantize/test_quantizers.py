"""Error-aware weight quantizers: --scale-search mse (quantize/scale_search.py) and --awq (quantize/awq.py).

numpy oracles for the math (the search lowers each block's squared error against round-to-nearest and the plain
search, in the same layout; AWQ's fold leaves the fp32 graph's outputs unchanged), the quantized dir against
numpy's dequantization, the manifest's record (and older manifests without it), the CLI options and refusals."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from gptedge.cli import main
from gptedge.onnx_files import Initializers
from gptedge.quantize import awq
from gptedge.quantize import int8_math as qm
from gptedge.quantize import nbit_math as nm
from gptedge.quantize.quantizer import QuantizeRecipe, quantize_model_dir
from gptedge.runtime import load
from gptedge.runtime.errors import InvalidArgumentError
from gptedge.runtime.modeldir.manifest import MANIFEST_NAME, read_manifest

from ..support.quant import fake_quantized

CALIBRATION = "samples/calibration/emma_ch1-4.txt"


def seeded_weights(n=64, k=256, seed=0) -> np.ndarray:
    """Rows (N, K) like a trained linear's: mostly small, a few outliers per block."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32) * 0.02
    w[rng.random(w.shape) < 0.02] *= 8
    return w


def block_errors(w, deq, bs):
    return np.square(deq - w).reshape(w.shape[0], -1, bs).sum(-1)


@pytest.mark.parametrize("symmetric, gain", [(False, 0.99), (True, 0.998)])  # zero point 8 leaves it little to move
def test_mse_search_lowers_the_4bit_block_error_in_the_same_layout(symmetric, gain):
    w = seeded_weights()
    rtn = nm.quantize_4bit(w, 32, symmetric, search=False)
    plain = nm.quantize_4bit(w, 32, symmetric)
    mse = nm.quantize_4bit(w, 32, symmetric, scale_search="mse")
    # the layout: same arrays, shapes and types (zero points: None where symmetric)
    for a, b in zip(plain, mse, strict=True):
        assert (a is None and b is None) or (a.shape == b.shape and a.dtype == b.dtype)
    e_rtn, e_plain, e_mse = (block_errors(w, nm.dequantize_4bit(*q), 32) for q in (rtn, plain, mse))
    assert (e_mse <= e_plain * (1 + 1e-6)).all()  # never worse on any block: plain's candidates are among its own
    assert e_mse.sum() < gain * e_plain.sum() and e_mse.sum() < 0.95 * e_rtn.sum()
    if not symmetric:
        assert nm.unpack_nibbles(mse[2]).max() <= 15


def test_mse_search_lowers_the_8bit_block_error():
    w = seeded_weights(seed=1)
    plain = qm.quantize_blocks_u8(w, 32)
    mse = qm.quantize_blocks_u8(w, 32, "mse")
    assert mse[0].dtype == np.uint8 and mse[0].shape == plain[0].shape and mse[1].shape == plain[1].shape
    assert mse[0].min() >= 1  # -127..127 around 128, as the plain blocks
    e_plain = block_errors(w, qm.dequantize_blocks_u8(*plain), 32)
    e_mse = block_errors(w, qm.dequantize_blocks_u8(*mse), 32)
    assert (e_mse <= e_plain * (1 + 1e-6)).all() and e_mse.sum() < 0.99 * e_plain.sum()


def test_an_unknown_search_is_refused():
    with pytest.raises(ValueError, match="unknown scale search"):
        nm.quantize_4bit(seeded_weights(), 32, scale_search="hqq")
    with pytest.raises(InvalidArgumentError, match="scale search must be range or mse"):
        QuantizeRecipe("weight-only", scale_search="hqq")


def ln_linear_model(k=64, n=48, seed=0) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """x -> LayerNormalization(gamma, beta) -> MatMul(W) -> Add(b) -> y; and a second MatMul on x (no LayerNorm)."""
    rng = np.random.default_rng(seed)
    inits = {"g": rng.uniform(0.5, 2, k).astype(np.float32), "b": rng.standard_normal(k).astype(np.float32),
             "w": rng.standard_normal((k, n)).astype(np.float32) * 0.1,
             "bias": rng.standard_normal(n).astype(np.float32),
             "w2": rng.standard_normal((k, n)).astype(np.float32)}
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], name="ln", axis=-1),
             helper.make_node("MatMul", ["ln", "w"], ["mm"], name="lin"),
             helper.make_node("Add", ["mm", "bias"], ["y"], name="add"),
             helper.make_node("MatMul", ["x", "w2"], ["z"], name="other")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, k])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("y", "z")],
                              [numpy_helper.from_array(v, name) for name, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), inits


def run(model, x):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})


def test_the_awq_fold_leaves_the_fp32_graph_equivalent():
    """gamma / s, beta / s and W's rows * s: the same outputs in fp32, for any positive s (before quantization)."""
    model, inits = ln_linear_model()
    sites = awq.fold_sites(model, Initializers(model))
    assert [(site.activation, site.divided, [n.name for n in site.linears]) for site in sites] == [
        ("ln", ("g", "b"), ["lin"])]  # the MatMul on x has no LayerNorm before it
    s = np.random.default_rng(1).uniform(0.2, 5, 64).astype(np.float32)
    overrides = awq.folded(sites, {"ln": s}, Initializers(model))
    assert set(overrides) == {"g", "b", "w"}
    np.testing.assert_allclose(overrides["w"], inits["w"] * s[:, None], rtol=1e-6)
    folded = awq.with_overrides(model, overrides, None)
    x = np.random.default_rng(2).standard_normal((16, 64)).astype(np.float32) * 3
    (y0, z0), (y1, z1) = run(model, x), run(folded, x)
    np.testing.assert_allclose(y1, y0, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(z1, z0)
    assert np.abs(numpy_helper.to_array(folded.graph.initializer[0]) - inits["g"]).max() > 0.1  # really changed


def gated_model(up_is_output: bool) -> onnx.ModelProto:
    """x -> (x Wg -> Sigmoid) * (x Wu) -> MatMul(Wd): a gated MLP; with up_is_output, up's product is also a graph
    output (dividing Wu's columns would change it)."""
    rng = np.random.default_rng(4)
    inits = {"wg": rng.standard_normal((8, 16)), "wu": rng.standard_normal((8, 16)), "wd": rng.standard_normal((16, 8))}
    nodes = [helper.make_node("MatMul", ["x", "wg"], ["g"], name="gate"), helper.make_node("Sigmoid", ["g"], ["a"]),
             helper.make_node("MatMul", ["x", "wu"], ["u"], name="up"),
             helper.make_node("Mul", ["a", "u"], ["p"], name="product"),
             helper.make_node("MatMul", ["p", "wd"], ["y"], name="down")]
    outputs = ["y", "u"] if up_is_output else ["y"]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 8])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
                              [numpy_helper.from_array(v.astype(np.float32), n) for n, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_gated_products_scale_folds_into_ups_columns_unless_up_is_an_output():
    model = gated_model(up_is_output=False)
    sites = awq.fold_sites(model, Initializers(model))
    assert [(site.activation, site.divided, [n.name for n in site.linears]) for site in sites] == [
        ("p", ("wu",), ["down"])]
    s = np.random.default_rng(1).uniform(0.2, 5, 16).astype(np.float32)
    folded = awq.with_overrides(model, awq.folded(sites, {"p": s}, Initializers(model)), None)
    x = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_allclose(run(folded, x)[0], run(model, x)[0], rtol=1e-4, atol=1e-4)
    model = gated_model(up_is_output=True)
    assert awq.fold_sites(model, Initializers(model)) == []


def test_awq_chooses_a_scale_that_lowers_the_output_error_on_an_outlier_channel():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((512, 64)).astype(np.float32)
    x[:, 5] *= 30  # one input channel far larger than the rest, as LayerNorm outputs of trained GPT-2s have
    w = rng.standard_normal((64, 32)).astype(np.float32) * 0.05
    recipe = QuantizeRecipe("weight-only", bits=4, accuracy_level=0)
    s, alpha, ratio = awq.choose_scale(x, [(w, 4)], recipe)
    assert alpha > 0 and ratio < 0.9 and s[5] == s.max()
    # the error it reports is the one it gets
    wq = awq.dequantized((w * s[:, None]).T, 4, 32, recipe.symmetric, "range").T
    plain = awq.dequantized(w.T, 4, 32, recipe.symmetric, "range").T
    assert np.square(x @ w - (x / s) @ wq).sum() < 0.9 * np.square(x @ w - x @ plain).sum()


@pytest.mark.slow  # a quantized dir and its numpy twin, both run
@pytest.mark.parametrize("bits", [4, 8])
def test_mse_dir_matches_numpy_dequantization(gpt2_model_dir, tmp_path, bits):
    """Float activations: the dir equals the fp32 graph holding numpy's mse dequantization, and not the plain one's."""
    recipe = QuantizeRecipe("weight-only", bits=bits, accuracy_level=0, scale_search="mse")
    manifest = quantize_model_dir(gpt2_model_dir, tmp_path / "q", recipe)
    assert manifest.quantization.scale_search == "mse" and "least squared error" in manifest.quantization.weights
    plain = fake_quantized(gpt2_model_dir, tmp_path / "plain", QuantizeRecipe("weight-only", bits=bits,
                                                                               accuracy_level=0))
    ids = np.random.default_rng(1).integers(0, 50257, size=(2, 10), dtype=np.int64)
    mask, pos = np.ones_like(ids), np.broadcast_to(np.arange(10), ids.shape).copy()
    out = {}
    for name, d in (("got", tmp_path / "q"), ("want", fake_quantized(gpt2_model_dir, tmp_path / "fq", recipe)),
                    ("plain", plain)):
        m = load(d, device="cpu")
        out[name] = m.forward(ids, mask, pos, m.empty_past(2))[0]
    tol = 2e-4 * np.abs(out["want"]).max()
    np.testing.assert_allclose(out["got"], out["want"], atol=tol)
    assert np.abs(out["plain"] - out["want"]).max() > 5 * np.abs(out["got"] - out["want"]).max()


def gammas(model_dir) -> dict[str, np.ndarray]:
    model = onnx.load(str(model_dir / "model.onnx"))
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if t.name.endswith(("ln_1.weight",
                                                                                                  "ln_2.weight"))}


def test_calibration_activations_keep_an_equal_share_of_each_window(gpt2_model_dir, tmp_path):
    """max_rows: each window gives ceil(max_rows / windows) of its positions, rows of the full run's, the rest dropped
    as it goes (all of them, every site, was gigabytes for a 1B model)."""
    manifest = read_manifest(gpt2_model_dir)
    windows = [np.random.default_rng(i).integers(0, 200, (1, 32)).astype(np.int64) for i in range(3)]
    model = onnx.load(str(gpt2_model_dir / manifest.model_file))
    names = [site.activation for site in awq.fold_sites(model, Initializers(model, gpt2_model_dir))][:2]
    full = awq.calibration_activations(gpt2_model_dir, manifest, names, windows, tmp_path)
    kept = awq.calibration_activations(gpt2_model_dir, manifest, names, windows, tmp_path, max_rows=40)
    for n in names:
        assert full[n].shape[0] == 96 and kept[n].shape == (3 * 14, full[n].shape[1])
        for w in range(3):  # window w's share: 14 of its own 32 rows, in order
            mine = full[n][32 * w:32 * (w + 1)]
            picked = [np.flatnonzero((mine == row).all(axis=1)) for row in kept[n][14 * w:14 * (w + 1)]]
            assert all(len(i) == 1 for i in picked) and np.all(np.diff([i[0] for i in picked]) > 0)


@pytest.mark.slow  # an AWQ search through the command
def test_cli_awq_folds_scales_into_the_layernorms_and_the_manifest_says_so(gpt2_model_dir, tmp_path):
    runner = CliRunner()
    base = ["quantize", str(gpt2_model_dir), "--method", "weight-only", "--bits", "4"]
    plain = runner.invoke(main, [*base, "-o", str(tmp_path / "plain")])  # --calibration without --awq: refused
    result = runner.invoke(main, [*base, "-o", str(tmp_path / "awq"), "--calibration", CALIBRATION, "--awq",
                                  "--scale-search", "mse"])
    assert plain.exit_code == 0 and result.exit_code == 0, result.output
    assert "mse scales, awq" in result.output
    a, b = gammas(tmp_path / "plain"), gammas(tmp_path / "awq")
    assert set(a) == set(b) and len(a) == 4  # 2 blocks x (ln_1, ln_2): the same initializers, other values
    assert any(np.abs(a[n] - b[n]).max() > 1e-3 for n in a), "--awq was ignored: no LayerNorm changed"
    same_ops = [[n.op_type for n in onnx.load(str(tmp_path / d / "model.onnx")).graph.node] for d in ("plain", "awq")]
    assert same_ops[0] == same_ops[1]  # the same graph: only numbers differ
    q = json.loads((tmp_path / "awq" / MANIFEST_NAME).read_text())["quantization"]
    assert q["awq"] is True and q["scale_search"] == "mse" and "folded into the normalizations" in q["weights"]
    assert read_manifest(tmp_path / "awq").quantization.label.endswith(", mse scales, awq")
    load(tmp_path / "awq", device="cpu")  # the dir loads: its claims hold


def test_a_manifest_written_before_the_fields_reads_as_the_plain_search(gpt2_model_dir, tmp_path):
    quantize_model_dir(gpt2_model_dir, tmp_path / "q", QuantizeRecipe("weight-only", bits=4))
    path = tmp_path / "q" / MANIFEST_NAME
    data = json.loads(path.read_text())
    del data["quantization"]["scale_search"], data["quantization"]["awq"]
    path.write_text(json.dumps(data))
    q = read_manifest(tmp_path / "q").quantization
    assert (q.scale_search, q.awq) == ("range", False)


def test_refusals(gpt2_model_dir, tmp_path):
    with pytest.raises(InvalidArgumentError, match="--awq applies to weight-only"):
        QuantizeRecipe("dynamic", awq=True)
    runner = CliRunner()
    for args, message in [
        (["--method", "dynamic", "--scale-search", "mse"], "--scale-search mse applies to weight-only (MatMulNBits "
                                                          "blocks), not dynamic"),
        (["--method", "dynamic", "--awq", "--calibration", CALIBRATION], "--awq applies to weight-only"),
        (["--method", "weight-only", "--awq"], "--awq needs --calibration TEXT_FILE"),
    ]:
        result = runner.invoke(main, ["quantize", str(gpt2_model_dir), "-o", str(tmp_path / "x"), *args])
        assert result.exit_code == 2 and result.output.strip().splitlines()[-1].startswith("Error: "), result.output
        assert message in result.output, result.output
        assert len(result.output.strip().splitlines()) <= 3 and not (tmp_path / "x").exists()
