"""Rungs 3-4 on exported graphs, the model directory's contents, atomic writes."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from gptedge.export.exporter import export_model
from gptedge.export.validate import compare_graph, compare_greedy, greedy_prompts
from gptedge.runtime import contract as C
from gptedge.runtime import load
from gptedge.runtime.errors import OutputExistsError, ParityError
from gptedge.runtime.modeldir.manifest import Manifest, ModelShape

from ..support.checkpoints import tiny_reference


GRAPHS = [("gpt2", "standard", True), ("gpt2", "standard", False), ("gpt2", "kv_buffer", True),
          ("openai-gpt", "standard", True)]


@pytest.mark.parametrize("arch, graph, fused", GRAPHS)
def test_rung3_graph_matches_reference_prefill_and_decode(tmp_path, arch, graph, fused):
    ref = tiny_reference(arch, seed=11)
    export_model(ref, tmp_path / "m", validate=False, graph_variant=graph, fused=fused)
    loaded = load(tmp_path / "m", device="cpu")
    figures = compare_graph(ref, loaded, batch=3, prompt_len=9, decode_steps=4)
    assert figures.max_abs_diff <= 1e-4
    assert figures.top1_agreement == 1.0
    assert figures.decode_steps == 4 and figures.batch == 3 and figures.prompt_tokens == 9


@pytest.mark.slow  # 64 greedy tokens per prompt through the graph and the reference
@pytest.mark.parametrize("arch, graph, fused", GRAPHS)
def test_rung4_greedy_ids_then_text_identical(tmp_path, arch, graph, fused):
    ref = tiny_reference(arch, seed=12)
    export_model(ref, tmp_path / "m", validate=False, graph_variant=graph, fused=fused)
    loaded = load(tmp_path / "m", device="cpu")
    prompts = greedy_prompts(ref.cfg.vocab_size, seed=3) + [[42, 7, 9, 1000, 3]]
    figures = compare_greedy(ref, loaded, prompts, new_tokens=64)
    assert figures.tokens_compared >= 64 * len(prompts) - 4 * 64  # eos may end one early
    assert figures.identical and figures.prompts == len(prompts)


def test_export_records_parity_in_manifest(gpt2_model_dir):
    manifest = json.loads((gpt2_model_dir / "gptedge.json").read_text())
    graph = manifest["parity"]["graph_vs_reference"]
    assert graph["max_abs_diff"] <= 1e-4 and graph["decode_steps"] >= 3 and graph["batch"] >= 2
    assert manifest["parity"]["greedy_vs_reference"]["identical"] is True
    assert manifest["precision"] == "fp32" and manifest["graph"] == "standard"
    assert manifest["shape"] == {"arch": "gpt2", "n_layer": 2, "n_head": 4, "head_dim": 8, "vocab_size": 50257,
                                 "context_length": 128}
    assert len(manifest["source"]["sha256"]) == 64
    assert {p.name for p in gpt2_model_dir.iterdir()} == {
        "model.onnx", "config.json", "generation_config.json", "tokenizer.json", "gptedge.json",
        "genai_config.json", "tokenizer_config.json"}


def test_graph_contract_names_dtypes_and_dynamic_axes(gpt2_model_dir):
    model = onnx.load(str(gpt2_model_dir / "model.onnx"))
    names = C.IONames(2)
    assert [i.name for i in model.graph.input] == names.inputs + names.optional_inputs
    keep = next(t for t in model.graph.initializer if t.name == C.LOGITS_TO_KEEP)
    assert onnx.numpy_helper.to_array(keep).shape == () and int(onnx.numpy_helper.to_array(keep)) == 0
    assert [o.name for o in model.graph.output] == names.outputs
    dtypes = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    assert dtypes[C.INPUT_IDS] == dtypes[C.ATTENTION_MASK] == dtypes[C.POSITION_IDS] == onnx.TensorProto.INT64
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in [*model.graph.input, *model.graph.output]}
    assert dims[C.past_key(0)] == [C.DIM_BATCH, 4, C.DIM_PAST, 8]
    assert dims[C.present_value(1)] == [C.DIM_BATCH, 4, C.DIM_TOTAL, 8]
    assert dims[C.LOGITS] == [C.DIM_BATCH, C.DIM_LOGITS, 50257]


def test_tied_embedding_stored_once(gpt2_model_dir):
    model = onnx.load(str(gpt2_model_dir / "model.onnx"))
    big = [t for t in model.graph.initializer if 50257 in t.dims]
    assert [t.name for t in big] == ["wte.weight"]
    users = [n.op_type for n in model.graph.node if "wte.weight" in n.input]
    assert sorted(users) == ["Gather", "Gemm"]


def test_one_graph_serves_prefill_and_decode_in_batch(gpt2_loaded):
    ids = np.array([[5, 6, 7]], dtype=np.int64)
    mask = np.ones((1, 3), dtype=np.int64)
    logits, presents = gpt2_loaded.forward(ids, mask, np.arange(3)[None], gpt2_loaded.empty_past(1))
    assert logits.shape == (1, 3, 50257) and presents[0].shape == (1, 4, 3, 8)
    mask = np.ones((1, 4), dtype=np.int64)
    logits, presents = gpt2_loaded.forward(np.array([[8]]), mask, np.array([[3]]), presents)
    assert logits.shape == (1, 1, 50257) and presents[0].shape == (1, 4, 4, 8)


def test_existing_output_kept_without_force_and_replaced_with_it(tmp_path):
    ref = tiny_reference("gpt2", seed=13)
    out = tmp_path / "m"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    # --force replaces only what gptedge wrote: a manifest that parses (test_outputs_never_touch_inputs)
    (out / "gptedge.json").write_text(json.dumps(Manifest(shape=ModelShape("gpt2", 1, 1, 1, 1, 1)).to_dict()))
    with pytest.raises(OutputExistsError, match="exists; pass --force"):
        export_model(ref, out, validate=False)
    assert (out / "keep.txt").read_text() == "mine"
    export_model(ref, out, force=True, validate=False)
    assert not (out / "keep.txt").exists() and (out / "model.onnx").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # no temporary directories left


def test_failed_validation_leaves_nothing(tmp_path, monkeypatch):
    import gptedge.export.exporter as exporter

    def broken_graph(cfg, weights, opset, **kw):  # a graph whose weights differ from the reference's
        weights = dict(weights)
        weights["h.0.mlp.c_fc.bias"] = weights["h.0.mlp.c_fc.bias"] + 0.5
        return build(cfg, weights, opset, **kw)

    build = exporter.build_graph
    monkeypatch.setattr(exporter, "build_graph", broken_graph)
    with pytest.raises(ParityError, match=r"max \|diff\| .* > 1e-04 in .* top-1 agreement"):
        export_model(tiny_reference("gpt2", seed=14), tmp_path / "m")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # a wider model exported
def test_large_models_use_external_data(tmp_path, monkeypatch):
    import gptedge.onnx_files as onnx_files

    monkeypatch.setattr(onnx_files, "EXTERNAL_DATA_THRESHOLD", 1000)
    export_model(tiny_reference("gpt2", seed=15), tmp_path / "m")  # validates through the external-data file
    data, graph = (tmp_path / "m" / "model.onnx.data").stat(), (tmp_path / "m" / "model.onnx").stat()
    assert data.st_size > graph.st_size
    assert data.st_mode & 0o777 == graph.st_mode & 0o777  # as readable as the graph (onnx makes it 0600)


def test_kv_buffer_graph_is_updated_in_place(tmp_path):
    """The kv_buffer graph writes each step's keys/values into the buffer it was given, at the right place."""
    ref = tiny_reference("gpt2", seed=16)
    export_model(ref, tmp_path / "m", validate=False, graph_variant="kv_buffer")
    loaded = load(tmp_path / "m", device="cpu")
    assert loaded.variant.name == "kv_buffer"
    assert C.LOGITS_TO_KEEP not in loaded.manifest.inputs  # optional: GenAI leaves it unfed
    assert C.LOGITS_TO_KEEP in {i.name for i in loaded.session.get_overridable_initializers()}
    ids = np.array([[3, 4, 5]], dtype=np.int64)
    state = loaded.variant.start(1, 8)
    state.run(ids, np.ones((1, 3), np.int64), np.arange(3)[None])
    first = state.buffers[0]
    assert first.shape() == [1, 4, 8, 8]
    where = first.data_ptr()
    state.run(np.array([[6]]), np.ones((1, 4), np.int64), np.array([[3]]))
    assert state.buffers[0].data_ptr() == where  # the same memory: nothing was reallocated or copied
    _, presents = loaded.forward(np.array([[3, 4, 5, 6]]), np.ones((1, 4), np.int64), np.arange(4)[None],
                                 loaded.empty_past(1))
    assert np.abs(first.numpy()[:, :, :4] - presents[0]).max() < 1e-5


def test_kv_buffer_needs_fused_gpt2(tmp_path):
    from gptedge.runtime.errors import CheckpointError

    with pytest.raises(CheckpointError,
                       match="kv_buffer graph needs GroupQueryAttention; openai-gpt .* PlainAttention only"):
        export_model(tiny_reference("openai-gpt"), tmp_path / "m", graph_variant="kv_buffer")
    assert not (tmp_path / "m").exists()


def test_opset_is_checked(tmp_path):
    from gptedge.runtime.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="opset 11 is not supported") as refused:
        export_model(tiny_reference("gpt2"), tmp_path / "m", opset=11)
    assert refused.value.exit_code == 2  # a bad command line, as an opset past the newest is
    export_model(tiny_reference("gpt2"), tmp_path / "m18", opset=18, greedy_tokens=8)
    assert onnx.load(str(tmp_path / "m18" / "model.onnx")).opset_import[0].version == 18


@pytest.mark.parametrize("arch, graph, fused, attention", [
    ("gpt2", "standard", True, "MultiHeadAttention"), ("gpt2", "standard", False, None),
    ("gpt2", "kv_buffer", True, "GroupQueryAttention"), ("openai-gpt", "standard", True, None)])
def test_attention_kind_follows_graph_and_fused(tmp_path, arch, graph, fused, attention):
    """fused is a preference (the original GPT falls back to plain ops), the kv_buffer graph a requirement."""
    manifest = export_model(tiny_reference(arch), tmp_path / "m", validate=False, graph_variant=graph, fused=fused)
    ops = {n.op_type for n in onnx.load(str(tmp_path / "m" / "model.onnx")).graph.node}
    contrib = {"MultiHeadAttention", "GroupQueryAttention", "FastGelu"}
    assert ops & contrib == ({attention, "FastGelu"} if attention else set())
    assert manifest.source.contrib_ops == tuple(sorted(ops & contrib))
    assert ("Softmax" in ops) == (attention is None)  # plain attention: QK^T, Softmax, PV
    if attention == "GroupQueryAttention":  # the packed q | k | v goes in whole: key and value left empty, no Split
        model = onnx.load(str(tmp_path / "m" / "model.onnx"))
        assert "Split" not in ops
        assert all(list(n.input[1:3]) == ["", ""] for n in model.graph.node if n.op_type == attention)


def test_kv_buffer_refused_with_plain_ops(tmp_path):
    from gptedge.runtime.errors import CheckpointError

    with pytest.raises(CheckpointError, match="kv_buffer graph needs ONNX Runtime's contrib ops"):
        export_model(tiny_reference("gpt2"), tmp_path / "m", graph_variant="kv_buffer", fused=False)
    assert not (tmp_path / "m").exists()


def test_graph_constants_are_stored_once_by_value():
    from gptedge.export.graph_writer import GraphWriter

    g = GraphWriter()
    assert g.f32(0.5) == g.f32(0.5) != g.f32(1.0)
    assert g.i64([1]) == g.i64([1]) != g.i64(1) != g.i64([1, 2])  # shape and dtype are part of the value
    values = [onnx.numpy_helper.to_array(t) for t in g.initializers]
    assert len(values) == 5 and float(values[0]) == 0.5 and values[4].tolist() == [1, 2]
