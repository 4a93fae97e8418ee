"""Weight-only 4-bit with some linears kept at 8 bits (--keep-8bit): which nodes, parity with numpy, the manifest's
record and its check, refusals."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from gptedge.cli import main
from gptedge.quantize.quantizer import QuantizeRecipe, quantize_model_dir
from gptedge.runtime import load
from gptedge.runtime.checks.model_claims import SAYS
from gptedge.runtime.errors import InvalidArgumentError, ModelDirError
from gptedge.runtime.modeldir.manifest import MANIFEST_NAME, read_manifest

from ..support.quant import fake_quantized


def node_bits(model_dir) -> dict[str, int]:
    model = onnx.load(str(model_dir / "model.onnx"))
    return {n.name: next(a.i for a in n.attribute if a.name == "bits") for n in model.graph.node
            if n.op_type == "MatMulNBits"}


def test_kept_linears_are_8bit_and_the_rest_4bit(gpt2_model_dir, tmp_path):
    """The tiny model has 2 blocks: '*.mlp.c_proj' keeps one linear in each, 'h.0.attn.*' two more in block 0."""
    recipe = QuantizeRecipe("weight-only", bits=4, keep_8bit=("*.mlp.c_proj", "h.0.attn.*"))
    manifest = quantize_model_dir(gpt2_model_dir, tmp_path / "q", recipe)
    bits = node_bits(tmp_path / "q")
    eight = sorted(n for n, b in bits.items() if b == 8)
    assert eight == sorted(["h.0.attn.c_attn.MatMul", "h.0.attn.c_proj.MatMul", "h.0.mlp.c_proj.MatMul",
                            "h.1.mlp.c_proj.MatMul", "lm_head"]), eight
    assert Counter(bits.values()) == {4: 8 - 4, 8: 4 + 1}  # 8 linears, 4 kept; the 8-bit LM head
    assert manifest.precision == "int4"
    q = json.loads((tmp_path / "q" / MANIFEST_NAME).read_text())["quantization"]
    assert q["keep_8bit"] == ["*.mlp.c_proj", "h.0.attn.*"] and "at 8 bits, symmetric: *.mlp.c_proj" in q["weights"]
    assert manifest.quantization.label == "weight-only int4 b32 asym, emb int8, int8 *.mlp.c_proj h.0.attn.*"
    assert read_manifest(tmp_path / "q").quantization.recipe == recipe  # read back as written, a tuple again


@pytest.mark.slow  # a quantized dir and its numpy twin, both run
def test_mixed_parity_with_numpy_dequantized_weights(gpt2_model_dir, tmp_path):
    """Float activations: the mixed dir equals the fp32 graph holding numpy's dequantization of each linear at its
    own width (8 bits where kept, 4 elsewhere)."""
    recipe = QuantizeRecipe("weight-only", bits=4, keep_8bit=("h.1.mlp.*",), accuracy_level=0)
    quantize_model_dir(gpt2_model_dir, tmp_path / "q", recipe)
    got, want = load(tmp_path / "q", device="cpu"), load(fake_quantized(gpt2_model_dir, tmp_path / "fq", recipe),
                                                          device="cpu")
    ids = np.random.default_rng(1).integers(0, 50257, size=(2, 10), dtype=np.int64)
    mask, pos = np.ones_like(ids), np.broadcast_to(np.arange(10), ids.shape).copy()
    a, _ = got.forward(ids, mask, pos, got.empty_past(2))
    b, _ = want.forward(ids, mask, pos, want.empty_past(2))
    np.testing.assert_allclose(a, b, atol=2e-4 * np.abs(b).max())
    quantize_model_dir(gpt2_model_dir, tmp_path / "q4", QuantizeRecipe("weight-only", bits=4, accuracy_level=0))
    plain = load(tmp_path / "q4", device="cpu")
    c, _ = plain.forward(ids, mask, pos, plain.empty_past(2))
    assert np.abs(c - b).max() > 10 * np.abs(a - b).max()  # the kept linears really are 8-bit, not 4


def test_a_manifest_that_hides_kept_linears_is_refused(gpt2_model_dir, tmp_path):
    quantize_model_dir(gpt2_model_dir, tmp_path / "q", QuantizeRecipe("weight-only", bits=4, keep_8bit=("h.0.*",)))
    path = tmp_path / "q" / MANIFEST_NAME
    data = json.loads(path.read_text())
    data["quantization"]["keep_8bit"] = ["h.0.mlp.c_fc"]  # claims 1 kept linear; the graph has 4
    path.write_text(json.dumps(data))
    with pytest.raises(ModelDirError, match=f"{SAYS} 1 linears kept at 8 bits .* the graph's 8-bit MatMulNBits hold 5"):
        load(tmp_path / "q", device="cpu")


def test_keep_8bit_refusals(gpt2_model_dir, tmp_path):
    with pytest.raises(InvalidArgumentError, match="applies to weight-only 4-bit"):
        QuantizeRecipe("weight-only", keep_8bit=("*.mlp.c_proj",))
    with pytest.raises(InvalidArgumentError, match="applies to weight-only 4-bit"):
        QuantizeRecipe("dynamic", keep_8bit=("*",))
    with pytest.raises(InvalidArgumentError, match="non-empty"):
        QuantizeRecipe("weight-only", bits=4, keep_8bit=(" ",))
    runner = CliRunner()
    for args, message in [
        (["--bits", "4", "--keep-8bit", "h.2.*"], "--keep-8bit 'h.2.*' matches no linear: they are named "
                                                  "h.N.{attention.o / attention.qkv / mlp.down / mlp.up} (N = 0 .. 1)"
                                                  ", or as the graph names them (h.0.attn.c_attn)"),
        (["--keep-8bit", "h.0.*"], "applies to weight-only 4-bit (bits 4), not 8-bit weight-only"),
    ]:
        result = runner.invoke(main, ["quantize", str(gpt2_model_dir), "-o", str(tmp_path / "x"),
                                      "--method", "weight-only", *args])
        assert result.exit_code == 2 and result.output.strip().splitlines()[-1].startswith("Error: "), result.output
        assert message in result.output, result.output
        assert not (tmp_path / "x").exists()
    result = runner.invoke(main, ["quantize", str(gpt2_model_dir), "-o", str(tmp_path / "ok"), "--method",
                                  "weight-only", "--bits", "4", "--keep-8bit", "*.mlp.c_proj"])
    assert result.exit_code == 0 and "8-bit *.mlp.c_proj" in result.output, result.output
    assert Counter(node_bits(tmp_path / "ok").values()) == {4: 6, 8: 3}
