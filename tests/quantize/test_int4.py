"""Weight-only 4-bit: the MatMulNBits packing against numpy (the oracle), structure, parity, manifest, refusals."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from gptedge.cli import main
from gptedge.quantize import nbit_math as nm
from gptedge.quantize.quantizer import QuantizeRecipe, quantize_model_dir
from gptedge.runtime import load
from gptedge.runtime.errors import InvalidArgumentError
from gptedge.runtime.modeldir.manifest import MANIFEST_NAME, read_manifest

from ..support.checkpoints import tiny_reference, write_checkpoint
from ..support.quant import fake_quantized


def matmul_nbits(w: np.ndarray, x: np.ndarray, block_size: int, symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
    """One MatMulNBits node (bits=4, float activations) over quantize_4bit(W) -> (its output, numpy's)."""
    k, n = w.shape
    packed, scales, zp = nm.quantize_4bit(w.T, block_size, symmetric)
    inits = [numpy_helper.from_array(packed, "B"), numpy_helper.from_array(scales, "scales")]
    if zp is not None:
        inits.append(numpy_helper.from_array(zp, "zero_points"))
    node = helper.make_node("MatMulNBits", ["x"] + [t.name for t in inits], ["y"], domain="com.microsoft",
                            K=k, N=n, bits=4, block_size=block_size, accuracy_level=0)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n])], initializer=inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 9  # what gptedge writes: loadable by every ONNX Runtime gptedge supports (1.31 reads <= 13)
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    return got, x @ nm.dequantize_4bit(packed, scales, zp).T


@pytest.mark.parametrize("k,n,block_size,symmetric", [(64, 48, 32, True), (64, 48, 32, False), (256, 40, 128, False),
                                                       (96, 24, 32, False), (128, 16, 64, True)])
def test_matmul_nbits_equals_numpy_dequantize_then_matmul(k, n, block_size, symmetric):
    """The oracle for the packing (low nibble first; zero points packed per row, an odd block count padded)."""
    rng = np.random.default_rng(k + n)
    got, want = matmul_nbits(rng.normal(size=(k, n)).astype(np.float32), rng.normal(size=(5, k)).astype(np.float32),
                             block_size, symmetric)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_4bit_math():
    rng = np.random.default_rng(1)
    q = rng.integers(0, 16, size=(3, 4, 8), dtype=np.uint8)
    packed = nm.pack_nibbles(q)
    assert packed.shape == (3, 4, 4) and (packed[..., 0] == q[..., 0] | (q[..., 1] << 4)).all()
    assert (nm.unpack_nibbles(packed) == q).all()
    w = rng.normal(size=(48, 96)).astype(np.float32)
    for symmetric in (True, False):
        b, s, z = nm.quantize_4bit(w, 32, symmetric)
        assert b.shape == (48, 3, 16) and b.dtype == np.uint8 and s.shape == (48, 3)
        assert (z is None) if symmetric else (z.shape == (48, 2) and z.dtype == np.uint8)
        err = np.square(nm.dequantize_4bit(b, s, z) - w).sum()
        plain = nm.quantize_4bit(w, 32, symmetric, search=False)
        assert err <= np.square(nm.dequantize_4bit(*plain) - w).sum()  # the scale search never loses
        assert np.sqrt(err / w.size) < 0.1  # ~ 1/10 of a unit-normal weight
    b, s, _ = nm.quantize_4bit(np.array([[0.0] * 31 + [-2.0]], np.float32), 32, search=False)
    assert s[0, 0] == pytest.approx(0.25) and nm.unpack_nibbles(b)[0, 0, -1] == 0  # -2 -> level 0: (0 - 8) * 0.25


@pytest.fixture(scope="module")
def wide_model_dir(tmp_path_factory):
    """n_embd 128: blocks of 64 and 128 fit (the shared tiny model is 32 wide)."""
    from gptedge.export.exporter import export_checkpoint

    base = tmp_path_factory.mktemp("wide")
    ck = write_checkpoint(tiny_reference("gpt2", seed=3, n_embd=128, n_head=4), base / "ck")
    export_checkpoint(ck, base / "fp32")
    return base / "fp32"


RECIPES = [  # (model, block size, symmetric, embedding bits)
    ("tiny", 32, True, 4),
    ("tiny", 32, False, 8),
    ("wide", 128, False, 4),
    ("wide", 64, True, 8),
]


@pytest.mark.slow  # a wider model exported, each recipe and its numpy twin run
@pytest.mark.parametrize("which,block_size,symmetric,embedding_bits", RECIPES)
def test_int4_parity_with_numpy_dequantized_weights(gpt2_model_dir, wide_model_dir, tmp_path, which, block_size,
                                                    symmetric, embedding_bits):
    """Float activations (accuracy_level 0): the 4-bit dir's logits equal those of the fp32 graph whose weights
    are the numpy dequantization of the same blocks: MatMulNBits, the LM head and the embedding's in-graph
    nibble unpacking all read the packing as numpy does."""
    src = {"tiny": gpt2_model_dir, "wide": wide_model_dir}[which]
    recipe = QuantizeRecipe("weight-only", bits=4, block_size=block_size, symmetric=symmetric,
                            embedding_bits=embedding_bits, accuracy_level=0)
    quantize_model_dir(src, tmp_path / "q4", recipe)
    got, want = load(tmp_path / "q4", device="cpu"), load(fake_quantized(src, tmp_path / "fq", recipe), device="cpu")
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50257, size=(2, 12), dtype=np.int64)
    mask, pos = np.ones_like(ids), np.broadcast_to(np.arange(12), ids.shape).copy()
    a, _ = got.forward(ids, mask, pos, got.empty_past(2))
    b, _ = want.forward(ids, mask, pos, want.empty_past(2))
    np.testing.assert_allclose(a, b, atol=2e-4 * np.abs(b).max())


def test_int4_structure_and_manifest(gpt2_model_dir, tmp_path):
    n_layer = 2
    manifest = quantize_model_dir(gpt2_model_dir, tmp_path / "q", QuantizeRecipe("weight-only", bits=4,
                                                                                 symmetric=False))
    model = onnx.load(str(tmp_path / "q" / "model.onnx"))
    nbits = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    bits = Counter(next(a.i for a in n.attribute if a.name == "bits") for n in nbits)
    assert bits == {4: 4 * n_layer, 8: 1}  # the linears 4-bit; the tied LM head 8-bit by default
    assert all(len(n.input) == 4 for n in nbits if n.input[1].endswith(".q4"))  # asymmetric: zero points
    vocab_sized = [t for t in model.graph.initializer if 50257 in t.dims and np.prod(t.dims) >= 50257 * 32]
    assert len(vocab_sized) == 1 and vocab_sized[0].data_type == TensorProto.UINT8  # tied weight stored once
    on_disk = json.loads((tmp_path / "q" / MANIFEST_NAME).read_text())
    q = on_disk["quantization"]
    assert on_disk["precision"] == "int4" and manifest.precision == "int4"
    assert (q["bits"], q["block_size"], q["symmetric"], q["embedding_bits"]) == (4, 32, False, 8)
    assert "4-bit, asymmetric" in q["weights"] and "8-bit" in q["embedding_and_lm_head"]
    assert q["kept_float"] == "position embedding, LayerNorms, biases"
    assert manifest.quantization.label == "weight-only int4 b32 asym, emb int8"
    assert load(tmp_path / "q", device="cpu").generate("It is a truth", max_new_tokens=4, greedy=True).ids


@pytest.mark.slow  # two quantizations compared
def test_int4_embedding_unpacks_nibbles_and_shrinks(gpt2_model_dir, tmp_path):
    quantize_model_dir(gpt2_model_dir, tmp_path / "e4", QuantizeRecipe("weight-only", bits=4, embedding_bits=4))
    quantize_model_dir(gpt2_model_dir, tmp_path / "e8", QuantizeRecipe("weight-only", bits=4))
    quantize_model_dir(gpt2_model_dir, tmp_path / "w8", QuantizeRecipe("weight-only"))
    model = onnx.load(str(tmp_path / "e4" / "model.onnx"))
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops["BitShift"] == 4 and ops["MatMulNBits"] == 4 * 2 + 1  # weight rows and zero points
    tied = next(t for t in model.graph.initializer if tuple(t.dims) == (50257, 1, 16))  # (V, C/bs, bs/2)
    assert sorted(n.op_type for n in model.graph.node if tied.name in n.input) == ["Gather", "MatMulNBits"]
    size = {d: (tmp_path / d / "model.onnx").stat().st_size for d in ("e4", "e8", "w8")}
    assert size["e4"] < size["e8"] < size["w8"]
    assert size["e4"] < 0.6 * size["w8"]


def test_old_manifest_without_bit_fields_still_reads(gpt2_model_dir, tmp_path):
    quantize_model_dir(gpt2_model_dir, tmp_path / "q", QuantizeRecipe("weight-only"))
    path = tmp_path / "q" / MANIFEST_NAME
    data = json.loads(path.read_text())
    for key in ("bits", "symmetric", "embedding_bits"):
        del data["quantization"][key]
    path.write_text(json.dumps(data))
    q = read_manifest(tmp_path / "q").quantization
    assert (q.bits, q.symmetric, q.embedding_bits, q.label) == (8, True, 8, "weight-only")


def test_recipe_refusals(gpt2_model_dir, tmp_path):
    for kwargs, message in [(dict(method="dynamic", bits=4), "bits 4 does not apply to dynamic"),
                            (dict(method="static", symmetric=False), "asymmetric applies to 4-bit"),
                            (dict(method="weight-only", bits=3), "bits 3 does not apply"),
                            (dict(method="weight-only", symmetric=False), "asymmetric applies to 4-bit")]:
        with pytest.raises(InvalidArgumentError, match=message):
            QuantizeRecipe(**kwargs)
    default4 = QuantizeRecipe("weight-only", bits=4)  # the defaults chosen by KL on the sample model (README)
    assert (default4.block_size, default4.symmetric, default4.embedding_bits) == (32, False, 8)
    assert (QuantizeRecipe("weight-only").symmetric, QuantizeRecipe("dynamic").embedding_bits) == (True, 8)
    with pytest.raises(InvalidArgumentError, match="--block-size 64 does not divide n_embd 32: choose 16, 32"):
        quantize_model_dir(gpt2_model_dir, tmp_path / "x", QuantizeRecipe("weight-only", bits=4, block_size=64))
    assert not (tmp_path / "x").exists()


def test_cli_int4_options(gpt2_model_dir, tmp_path):
    runner = CliRunner()
    for args, message in [
        (["--method", "dynamic", "--bits", "4"], "--bits applies to --method weight-only only"),
        (["--method", "dynamic", "--asymmetric"], "--symmetric/--asymmetric applies to --method weight-only"),
        # the recipe's rule
        (["--method", "weight-only", "--asymmetric"], "asymmetric applies to 4-bit weights (bits 4)"),
        (["--method", "weight-only", "--bits", "3"], "'3' is not one of"),
        (["--method", "weight-only", "--bits", "4", "--block-size", "64"], "--block-size 64 does not divide n_embd"),
        (["--method", "weight-only", "--block-size", "1024"], "--block-size 1024 does not divide n_embd 32"),
    ]:
        result = runner.invoke(main, ["quantize", str(gpt2_model_dir), "-o", str(tmp_path / "x"), *args])
        assert result.exit_code == 2 and result.output.strip().splitlines()[-1].startswith("Error: "), args
        assert message in result.output, (args, result.output)
        assert not (tmp_path / "x").exists()
    result = runner.invoke(main, ["quantize", str(gpt2_model_dir), "-o", str(tmp_path / "ok"), "--method",
                                  "weight-only", "--bits", "4", "--asymmetric", "--embedding-bits", "4"])
    assert result.exit_code == 0, result.output
    q = read_manifest(tmp_path / "ok").quantization
    assert (q.bits, q.symmetric, q.embedding_bits) == (4, False, 4) and "4-bit, embedding 4-bit" in result.output
