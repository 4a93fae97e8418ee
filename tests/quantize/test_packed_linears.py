"""Sibling linears packed into one MatMulNBits (quantize/packed_linears.py): a gated MLP's gate and up, which read the
same input, run as one node of twice the width and a Split. The outputs are the unpacked graph's, siblings unlike in
bits stay apart, GPT-2 (no siblings) is unchanged, and the manifest check counts the linears a packed node holds."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from gptedge import runtime
from gptedge.cli import main
from gptedge.export.exporter import export_checkpoint
from gptedge.quantize import awq
from gptedge.quantize.packed_linears import pack_sibling_linears, sibling_groups
from gptedge.quantize.weight_only import rewrite_weight_only
from gptedge.runtime.errors import ModelDirError
from gptedge.runtime.modeldir.manifest import read_manifest
from gptedge.runtime.modeldir.recipe import PACKED_JOIN, block_linears

from ..support.lineage_checkpoints import write_variant_checkpoint


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("packed")
    export_checkpoint(write_variant_checkpoint(root / "ck", "gqa2-linear"), root / "fp32", graph_variant="kv_buffer")
    return root / "fp32"


def quantize(source, out, *args):
    return CliRunner().invoke(main, ["quantize", str(source), "-o", str(out), "--method", "weight-only", *args])


def _rewritten(model_dir, bits, keep_8bit=()):
    manifest = read_manifest(model_dir)
    model, _ = rewrite_weight_only(onnx.load(str(model_dir / "model.onnx")), 32, 4, bits, symmetric=False,
                                   base_dir=model_dir, keep_8bit=keep_8bit,
                                   linear_names=block_linears(manifest.shape.n_layer, manifest.shape.arch))
    return model, manifest


@pytest.mark.parametrize("bits", [8, 4])
def test_gate_and_up_pack_into_one_node_whose_outputs_are_the_unpacked_graphs(llama_dir, tmp_path, bits):
    model, manifest = _rewritten(llama_dir, bits)
    groups = sibling_groups(model)
    assert len(groups) == manifest.shape.n_layer
    assert all([n.name.rsplit(".", 2)[-2] for n in g] == ["gate_proj", "up_proj"] for g in groups)
    before = sum(n.op_type == "MatMulNBits" for n in model.graph.node)
    packed = pack_sibling_linears(onnx.ModelProto.FromString(model.SerializeToString()))
    nodes = packed.graph.node
    assert sum(n.op_type == "MatMulNBits" for n in nodes) == before - manifest.shape.n_layer
    joined = [n for n in nodes if n.op_type == "MatMulNBits" and PACKED_JOIN in n.input[1]]
    assert len(joined) == manifest.shape.n_layer
    width = next(a.i for a in groups[0][0].attribute if a.name == "N")
    assert {next(a.i for a in n.attribute if a.name == "N") for n in joined} == {2 * width}
    splits = [n for n in nodes if n.op_type == "Split"]
    assert [list(s.output) for s in splits[-len(groups):]] == [[m.output[0] for m in g] for g in groups]
    assert not sibling_groups(packed)  # nothing left to pack
    ids = np.random.default_rng(3).integers(3, 300, (1, 12)).astype(np.int64)
    base, got = (session.run(["logits"], awq.window_feeds(session, manifest, ids))[0] for session in (
        awq.exposed_session(model, [], tmp_path / "unpacked.onnx"),
        awq.exposed_session(packed, [], tmp_path / "packed.onnx")))
    assert np.abs(base).max() > 0.1
    np.testing.assert_allclose(got, base, atol=1e-6, rtol=0)  # the same dot products, one node instead of two


def test_siblings_of_different_bits_stay_apart(llama_dir):
    model, manifest = _rewritten(llama_dir, 4, keep_8bit=("*.mlp.up",))
    assert not sibling_groups(model)


def test_a_graph_without_siblings_is_left_as_it_is(gpt2_model_dir):
    model, _ = _rewritten(gpt2_model_dir, 8)
    text = model.SerializeToString()
    assert pack_sibling_linears(model).SerializeToString() == text


def test_a_quantized_gated_dir_loads_verifies_and_decodes_as_recorded(llama_dir, tmp_path):
    result = quantize(llama_dir, tmp_path / "w4", "--bits", "4", "--block-size", "32", "--keep-8bit", "*.mlp.*")
    assert result.exit_code == 0, result.output
    graph = onnx.load(str(tmp_path / "w4" / "model.onnx"))
    eight = [n for n in graph.graph.node if n.op_type == "MatMulNBits"
             and next(a.i for a in n.attribute if a.name == "bits") == 8]
    n_layer = read_manifest(llama_dir).shape.n_layer
    assert sum(PACKED_JOIN in n.input[1] for n in eight) == n_layer  # gate + up, both kept at 8 bits, packed
    runtime.load(tmp_path / "w4", device="cpu")  # the check counts 3 kept linears a block, not 2 nodes
    verify = CliRunner().invoke(main, ["verify", str(tmp_path / "w4")])
    assert verify.exit_code == 0, verify.output
    path = tmp_path / "w4" / "gptedge.json"
    manifest = json.loads(path.read_text())
    manifest["quantization"]["keep_8bit"] = ["*.mlp.down"]  # claims fewer kept linears than the graph holds
    path.write_text(json.dumps(manifest))
    with pytest.raises(ModelDirError, match=f"{n_layer} linears kept at 8 bits .* hold {3 * n_layer + 1}"):
        runtime.load(tmp_path / "w4", device="cpu")
