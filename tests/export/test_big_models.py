"""Big models (GPT-2 XL's 6.2 GB): export streams the weights into external data, releases the
reference before ONNX Runtime loads, validates fewer greedy positions; quantize reads external weights one
at a time and writes external data. Tiny models stand in, with the external-data threshold lowered."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

import gptedge.onnx_files as onnx_files
from gptedge.export.exporter import export_model, validation_plan
from gptedge.quantize.quantizer import QuantizeRecipe, quantize_model_dir
from gptedge.quantize.rewrite import Rewrite
from gptedge.runtime import load

from ..support.checkpoints import EXCERPT, tiny_reference, write_checkpoint


def external_offsets(model_path) -> dict[str, int]:
    model = onnx.load(str(model_path), load_external_data=False)
    return {t.name: int({e.key: e.value for e in t.external_data}["offset"]) for t in model.graph.initializer
            if t.data_location == TensorProto.EXTERNAL}


def test_weight_sink_writes_aligned_external_tensors_and_reads_them_back(tmp_path):
    rng = np.random.default_rng(0)
    big = rng.normal(size=(33, 70)).astype(np.float32)  # 9,240 bytes: not a multiple of the alignment
    ids = np.arange(300, dtype=np.int64)  # 2,400 bytes
    with onnx_files.WeightSink(tmp_path / "m.onnx", external=True) as sink:
        tensors = [sink.tensor("big", big), sink.tensor("ids", ids), sink.tensor("small", np.ones(3, np.float32))]
    assert [t.data_location for t in tensors] == [TensorProto.EXTERNAL, TensorProto.EXTERNAL, TensorProto.DEFAULT]
    assert not tensors[0].raw_data and numpy_helper.to_array(tensors[2]).tolist() == [1, 1, 1]
    offsets = [int({e.key: e.value for e in t.external_data}["offset"]) for t in tensors[:2]]
    assert offsets == [0, 3 * onnx_files.ALIGNMENT]  # 9,240 bytes rounded up to the next page
    for t, want in zip(tensors, (big, ids, np.ones(3, np.float32)), strict=True):
        got = onnx_files.read_initializer(t, tmp_path)
        assert got.dtype == want.dtype and np.array_equal(got, want)
    # onnx reads the same bytes (a graph holding them as initializers)
    g = onnx.helper.make_graph([], "g", [], [], initializer=tensors)
    onnx.save_model(onnx.helper.make_model(g), str(tmp_path / "m.onnx"))
    loaded = onnx.load(str(tmp_path / "m.onnx"))
    assert np.array_equal(numpy_helper.to_array(loaded.graph.initializer[0]), big)
    with pytest.raises(FileExistsError):  # a sink never truncates a data file it did not write
        onnx_files.WeightSink(tmp_path / "m.onnx", external=True)


def test_export_streams_weights_and_never_builds_them_as_protobuf(tmp_path, monkeypatch):
    """Past the threshold every weight goes straight to model.onnx.data: no TensorProto ever holds one."""
    made = []
    from_array = numpy_helper.from_array

    def spy(array, name=None):
        made.append((name, np.asarray(array).nbytes))
        return from_array(array, name)

    monkeypatch.setattr(numpy_helper, "from_array", spy)
    monkeypatch.setattr(onnx_files, "EXTERNAL_DATA_THRESHOLD", 1000)
    ref = tiny_reference("gpt2", seed=31)
    export_model(ref, tmp_path / "m", validate=False, graph_variant="kv_buffer")
    assert made and max(n for _, n in made) < onnx_files.INLINE_LIMIT, [m for m in made if m[1] >= 1024]
    offsets = external_offsets(tmp_path / "m" / "model.onnx")
    assert set(offsets) >= {"wte.weight", "wpe.weight", "h.0.attn.c_attn.weight", "h.1.mlp.c_proj.weight"}
    assert all(o % onnx_files.ALIGNMENT == 0 for o in offsets.values())
    graph = onnx.load(str(tmp_path / "m" / "model.onnx"), load_external_data=False)
    wte = next(t for t in graph.graph.initializer if t.name == "wte.weight")
    assert np.array_equal(onnx_files.read_initializer(wte, tmp_path / "m"), ref.wte.weight.detach().numpy())


def test_streamed_graph_equals_the_inline_one(tmp_path, monkeypatch):
    """The same nodes and the same weights whichever way the initializers are stored."""
    ref = tiny_reference("gpt2", seed=32)
    export_model(ref, tmp_path / "inline", validate=False)
    monkeypatch.setattr(onnx_files, "EXTERNAL_DATA_THRESHOLD", 1000)
    export_model(ref, tmp_path / "external", validate=False)
    assert not (tmp_path / "inline" / "model.onnx.data").exists()
    assert (tmp_path / "external" / "model.onnx.data").exists()
    a, b = (onnx.load(str(tmp_path / d / "model.onnx")) for d in ("inline", "external"))
    assert list(a.graph.node) == list(b.graph.node)
    assert [t.name for t in a.graph.initializer] == [t.name for t in b.graph.initializer]
    for x, y in zip(a.graph.initializer, b.graph.initializer, strict=True):
        assert np.array_equal(numpy_helper.to_array(x), numpy_helper.to_array(y)), x.name


def test_export_releases_its_reference_before_onnx_runtime_loads(tmp_path, monkeypatch):
    import gptedge.runtime as runtime

    ref = tiny_reference("gpt2", seed=33)
    seen = []
    original = runtime.load

    def spy(*args, **kwargs):
        seen.append({p.device.type for p in ref.parameters()})
        return original(*args, **kwargs)

    monkeypatch.setattr(runtime, "load", spy)
    manifest = export_model(ref, tmp_path / "m", release_reference=True, greedy_tokens=8)
    assert seen == [{"meta"}]  # the weights were gone when the graph was loaded for validation
    assert manifest.parity.graph_vs_reference.max_abs_diff <= 1e-4 and manifest.parity.greedy_vs_reference.identical
    kept = tiny_reference("gpt2", seed=33)
    export_model(kept, tmp_path / "k", validate=False)
    assert {p.device.type for p in kept.parameters()} == {"cpu"}  # not released unless asked


def test_big_models_validate_fewer_greedy_positions_and_say_so(tmp_path, monkeypatch):
    import gptedge.export.exporter as exporter

    assert validation_plan(10**9, 64).greedy_tokens == 64  # GPT-2 medium's 1.42 GB: everything
    plan = validation_plan(3 * 10**9, 64)  # GPT-2 large's 3.1 GB
    assert plan.greedy_tokens == exporter.BIG_MODEL_GREEDY_TOKENS and "not 64" in plan.note
    monkeypatch.setattr(exporter, "BIG_MODEL_BYTES", 0)  # the tiny model counts as big
    export_model(tiny_reference("gpt2", seed=34), tmp_path / "m")
    greedy = json.loads((tmp_path / "m" / "gptedge.json").read_text())["parity"]["greedy_vs_reference"]
    assert greedy["new_tokens_per_prompt"] == exporter.BIG_MODEL_GREEDY_TOKENS
    assert greedy["tokens_compared"] <= 3 * exporter.BIG_MODEL_GREEDY_TOKENS and greedy["identical"]
    assert greedy["note"].startswith(f"{exporter.BIG_MODEL_GREEDY_TOKENS} new tokens per greedy prompt, not 64")


@pytest.fixture(scope="module")
def inline_and_external(tmp_path_factory):
    """One tiny model exported twice: weights inline, and in model.onnx.data."""
    from gptedge.export.exporter import export_checkpoint

    base = tmp_path_factory.mktemp("big")
    ck = write_checkpoint(tiny_reference("gpt2", seed=35, n_embd=64), base / "ck")  # with a tokenizer (static)
    export_checkpoint(ck, base / "inline", validate=False, graph_variant="kv_buffer")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(onnx_files, "EXTERNAL_DATA_THRESHOLD", 1000)
        export_checkpoint(ck, base / "external", validate=False, graph_variant="kv_buffer")
    return base


RECIPES = {"dynamic": QuantizeRecipe("dynamic"), "weight-only": QuantizeRecipe("weight-only"),
           "int4": QuantizeRecipe("weight-only", bits=4), "static": QuantizeRecipe("static", calibration_sequences=4),
           "fp16": QuantizeRecipe("fp16"), "weight-only-float16": QuantizeRecipe("weight-only", float16=True)}


@pytest.mark.slow  # every method quantizes two exports
@pytest.mark.parametrize("name", RECIPES)
def test_quantized_from_external_weights_equals_from_inline(inline_and_external, tmp_path, monkeypatch, name):
    """The quantizer reads an external-data source tensor by tensor and gets what it gets from an inline one;
    a big output goes to external data, page-aligned."""
    base = inline_and_external
    text = EXCERPT.read_text(encoding="utf-8")[:20000] if name == "static" else None
    quantize_model_dir(base / "inline", tmp_path / "a", RECIPES[name], calibration_text=text)
    monkeypatch.setattr(onnx_files, "EXTERNAL_DATA_THRESHOLD", 1000)
    quantize_model_dir(base / "external", tmp_path / "b", RECIPES[name], calibration_text=text)
    assert not (tmp_path / "a" / "model.onnx.data").exists()
    offsets = external_offsets(tmp_path / "b" / "model.onnx")
    assert offsets and all(o % onnx_files.ALIGNMENT == 0 for o in offsets.values())
    a, b = (onnx.load(str(tmp_path / d / "model.onnx")) for d in ("a", "b"))
    assert list(a.graph.node) == list(b.graph.node)
    assert {t.name: numpy_helper.to_array(t).tobytes() for t in a.graph.initializer} == \
        {t.name: numpy_helper.to_array(t).tobytes() for t in b.graph.initializer}
    ids = [5, 6, 7, 8]
    assert load(tmp_path / "b", device="cpu").generate(ids, 6, greedy=True).ids == \
        load(tmp_path / "a", device="cpu").generate(ids, 6, greedy=True).ids


def test_rewrite_maps_external_weights_on_access_and_keeps_none(inline_and_external):
    model = onnx.load(str(inline_and_external / "external" / "model.onnx"), load_external_data=False)
    r = Rewrite(model, inline_and_external / "external")
    w = r.weights["h.0.mlp.c_fc.weight"]
    assert isinstance(w.base, np.memmap) and not w.flags.writeable  # a read-only map of the file, not a copy
    assert r.weights["h.0.mlp.c_fc.weight"] is not w  # mapped afresh each time: nothing accumulates
    assert r.weights.shape("wte.weight") == (50257, 64)  # shapes come from the graph, no data read
    with pytest.raises(ValueError, match="external data, but no directory"):
        Rewrite(model).weights["wte.weight"]


def test_4bit_row_chunks_give_the_same_blocks(monkeypatch):
    from gptedge.quantize import nbit_math as nm

    w = np.random.default_rng(2).normal(size=(70, 64)).astype(np.float32)
    whole = [nm.quantize_4bit(w, 32, sym) for sym in (True, False)]
    monkeypatch.setattr(nm, "ROW_CHUNK", 16)
    for sym, want in zip((True, False), whole, strict=True):
        got = nm.quantize_4bit(w, 32, sym)
        assert all((g is None and x is None) or np.array_equal(g, x) for g, x in zip(got, want, strict=True))
