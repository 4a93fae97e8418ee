"""`quantize --rotate-down` (quantize/rotation.py): each MLP down projection's input rotated online by a randomized
Hadamard transform of the block size, its weight rows by the transpose. Exact in fp32 on every family (GPT-2's
gelu(fc), Llama's / Qwen2's / Gemma's gated product, GPT-NeoX's dense_4h_to_h), recorded in the manifest and
checked against the graph on load."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from gptedge import runtime
from gptedge.cli import main
from gptedge.export.exporter import export_checkpoint
from gptedge.onnx_files import Initializers
from gptedge.quantize import awq
from gptedge.quantize.rotation import down_linears, randomized_hadamard, rotate_down_inputs
from gptedge.runtime.errors import InvalidArgumentError, ModelDirError
from gptedge.runtime.modeldir.manifest import read_manifest
from gptedge.runtime.modeldir.recipe import ROTATION_INIT, block_linears

from ..support.lineage_checkpoints import write_variant_checkpoint

VARIANTS = {"gqa2-linear": "kv_buffer", "qwen2-qkv-bias": "standard", "neox-parallel": "kv_buffer",
            "gemma-mqa": "kv_buffer"}


@pytest.fixture(scope="module")
def fp32_dirs(tmp_path_factory, gpt2_model_dir):
    root = tmp_path_factory.mktemp("rotate_down")
    dirs = {"gpt2": gpt2_model_dir}
    for variant, graph in VARIANTS.items():
        dirs[variant] = root / variant
        export_checkpoint(write_variant_checkpoint(root / f"ck-{variant}", variant), dirs[variant],
                          graph_variant=graph)
    return dirs


def quantize(source, out, *args):
    return CliRunner().invoke(main, ["quantize", str(source), "-o", str(out), *args])


@pytest.mark.parametrize("size", [16, 32, 64])
def test_the_rotation_is_an_orthogonal_signed_hadamard(size):
    h = randomized_hadamard(size)
    np.testing.assert_allclose(h @ h.T, np.eye(size), atol=1e-12)
    np.testing.assert_allclose(np.abs(h), 1 / np.sqrt(size))
    assert np.array_equal(h, randomized_hadamard(size))  # seeded: a dir's rotation is reproducible
    assert np.abs(h.sum(axis=0)).max() < size ** 0.5  # the signs: no column takes a constant block whole
    with pytest.raises(InvalidArgumentError, match="power-of-two size, got 24"):
        randomized_hadamard(24)


@pytest.mark.parametrize("variant", ["gpt2", *VARIANTS])
def test_rotating_down_leaves_each_familys_fp32_graph_equivalent(variant, fp32_dirs, tmp_path):
    """Every block's down projection (and nothing else) reads x H through the shared (1, b, b) rotation, holds H^T W,
    and the fp32 logits stay where they were."""
    model_dir = fp32_dirs[variant]
    model = onnx.load(str(model_dir / "model.onnx"))
    manifest = read_manifest(model_dir)
    names = block_linears(manifest.shape.n_layer, manifest.shape.arch)
    weights = Initializers(model, model_dir)
    downs = down_linears(model, weights, names)
    assert len(downs) == manifest.shape.n_layer
    assert all(names[d.input[1].removesuffix(".weight")].endswith(".mlp.down") for d in downs)
    rotated = rotate_down_inputs(model, weights, names, 32)
    turned = Initializers(rotated, model_dir)
    assert turned.shape(ROTATION_INIT) == (1, 32, 32)
    assert sum(ROTATION_INIT in n.input for n in rotated.graph.node) == manifest.shape.n_layer
    for d in downs:
        assert not np.allclose(turned[d.input[1]], weights[d.input[1]])
    others = [t for t in weights if t not in {d.input[1] for d in downs}]
    assert all(np.array_equal(turned[t], weights[t]) for t in others)
    ids = np.random.default_rng(6).integers(3, 300, (1, 12)).astype(np.int64)
    base, got = (session.run(["logits"], awq.window_feeds(session, manifest, ids))[0] for session in (
        awq.exposed_session(model, [], tmp_path / "base.onnx"),
        awq.exposed_session(rotated, [], tmp_path / "rotated.onnx")))
    assert np.abs(base).max() > 0.1
    np.testing.assert_allclose(got, base, atol=1e-4, rtol=0)


def test_a_block_that_does_not_divide_down_or_a_graph_without_down_is_one_line(fp32_dirs):
    model_dir = fp32_dirs["gqa2-linear"]  # MLP width 96
    model = onnx.load(str(model_dir / "model.onnx"))
    manifest = read_manifest(model_dir)
    weights = Initializers(model, model_dir)
    with pytest.raises(InvalidArgumentError, match="block size 64 does not divide h.0.mlp.down_proj.weight's K=96"):
        rotate_down_inputs(model, weights, block_linears(manifest.shape.n_layer, manifest.shape.arch), 64)
    with pytest.raises(InvalidArgumentError, match="no MLP down projection"):
        rotate_down_inputs(model, weights, {}, 32)


@pytest.mark.parametrize("variant", ["gpt2", "gqa2-linear"])
def test_quantize_rotate_down_records_it_and_the_dir_loads_and_decodes_close_to_fp32(variant, fp32_dirs, tmp_path):
    source = fp32_dirs[variant]
    result = quantize(source, tmp_path / "rot", "--method", "weight-only", "--block-size", "32", "--rotate-down")
    assert result.exit_code == 0, result.output
    assert "rotated down" in result.output
    plain = quantize(source, tmp_path / "plain", "--method", "weight-only", "--block-size", "32")
    assert plain.exit_code == 0, plain.output
    q = json.loads((tmp_path / "rot" / "gptedge.json").read_text())["quantization"]
    assert q["rotate_down"] is True and "Hadamard" in q["weights"]
    assert json.loads((tmp_path / "plain" / "gptedge.json").read_text())["quantization"]["rotate_down"] is False
    graphs = {d: onnx.load(str(tmp_path / d / "model.onnx")) for d in ("rot", "plain")}
    ops = {d: [n.op_type for n in g.graph.node] for d, g in graphs.items()}
    assert ops["rot"].count("MatMulNBits") == ops["plain"].count("MatMulNBits")  # the rotation stays float
    assert ops["rot"].count("MatMul") == ops["plain"].count("MatMul") + read_manifest(source).shape.n_layer
    rotation = next(t for t in graphs["rot"].graph.initializer if t.name == ROTATION_INIT)
    assert tuple(rotation.dims) == (1, 32, 32) and rotation.data_type == onnx.TensorProto.FLOAT
    ids = np.array([[1, 5, 77, 140, 9, 30, 31, 32]], np.int64)
    ref, rot = (runtime.load(d, device="cpu") for d in (source, tmp_path / "rot"))
    a, b = (m.forward(ids, np.ones_like(ids), np.arange(8)[None], m.empty_past(1))[0] for m in (ref, rot))
    assert np.abs(a - b).max() < 0.05 * np.abs(a).max()


def test_a_manifest_that_misstates_the_rotation_is_refused_on_load(fp32_dirs, tmp_path):
    source = fp32_dirs["gqa2-linear"]
    for name, extra in (("rot", ("--rotate-down",)), ("plain", ())):
        result = quantize(source, tmp_path / name, "--method", "weight-only", "--block-size", "32", *extra)
        assert result.exit_code == 0, result.output
    for name, claim, said in (("rot", False, "the graph rotates 2 down projections' inputs"),
                              ("plain", True, "the graph rotates no down projection's input")):
        path = tmp_path / name / "gptedge.json"
        manifest = json.loads(path.read_text())
        manifest["quantization"]["rotate_down"] = claim
        path.write_text(json.dumps(manifest))
        with pytest.raises(ModelDirError) as caught:
            runtime.load(tmp_path / name, device="cpu")
        assert f"rotate_down {str(claim).lower()}, {said}" in str(caught.value)
        assert "\n" not in str(caught.value)


def test_rotate_down_with_another_method_is_refused(fp32_dirs, tmp_path):
    result = quantize(fp32_dirs["gpt2"], tmp_path / "out", "--method", "dynamic", "--rotate-down")
    assert result.exit_code == 2
    assert "--rotate-down applies to weight-only" in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
