"""`pack --target web`'s planning and writing (gptedge/pack/web.py) over tiny synthetic dirs: a one-node graph
(inline or with external data) and the files beside it, the model-dir pipeline replaced by the manifests made
here. What a user reads is asserted: the written file's SHA-256 and bytes in gptedge-pack.json, the external data's
new name inside the graph, config.json's default dtype, each refusal's line. No export, no browser
(test_pack_web.py and test_web_node.py run real packs)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gptedge.pack import web
from gptedge.runtime.modeldir.manifest import Manifest, ModelShape, Quantization, Source

SHAPE = ModelShape("gpt2", 2, 4, 8, 100, 64)
CHECKPOINT = "ab" * 32


def _source(root: Path, name: str, manifest: Manifest, external: bool = False, tokenizer: str = "{}") -> Path:
    d = root / name
    d.mkdir()
    weight = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], name,
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], [weight])
    model = helper.make_model(graph)
    if external:
        onnx.save_model(model, str(d / "model.onnx"), save_as_external_data=True, location="model.onnx.data",
                        size_threshold=0)
    else:
        onnx.save_model(model, str(d / "model.onnx"))
    (d / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 8}))
    (d / "tokenizer.json").write_text(tokenizer)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": 99}))
    (d / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 64,
                                                         "clean_up_tokenization_spaces": True}))
    (d / "manifest.for-test").write_text(json.dumps(manifest.to_dict()))
    return d


@pytest.fixture()
def sources(tmp_path, monkeypatch):
    """name -> a source dir; check_model_dir reads the manifest each was made with."""
    monkeypatch.setattr(web, "check_model_dir",
                        lambda d: Manifest.from_dict(json.loads((Path(d) / "manifest.for-test").read_text())))
    # the synthetic graphs cannot run: the golden self-test (tests/web/test_pack_selftest.py) records a stand-in
    monkeypatch.setattr(web, "graph_entry", lambda source, manifest, dtype, file_name, target: {"file": file_name})
    fp32 = Manifest(SHAPE, source=Source(sha256=CHECKPOINT))
    q8 = dataclasses.replace(fp32, source=Source(fp32_source=Source(sha256=CHECKPOINT)),
                             quantization=Quantization(method="dynamic", bits=8))
    q4 = dataclasses.replace(q8, quantization=Quantization(method="weight-only", bits=4))
    return {"fp32": _source(tmp_path, "fp32", fp32), "q8": _source(tmp_path, "q8", q8, external=True),
            "q4": _source(tmp_path, "q4", q4), "root": tmp_path, "manifests": (fp32, q8, q4)}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_pack_records_what_it_wrote(sources):
    dest = sources["root"] / "site"
    dest.mkdir()
    pack = web.write_web_model([sources["fp32"], sources["q4"], sources["q8"]], dest)
    assert json.loads((dest / "gptedge-pack.json").read_text()) == pack
    assert (pack["format"], pack["target"], pack["recommended"]) == (1, "web", "q8")  # q8 first in the order
    by_dtype = {e["dtype"]: e for e in pack["models"]}
    assert [e["dtype"] for e in pack["models"]] == ["fp32", "q4", "q8"]  # the sources' order
    for dtype, entry in by_dtype.items():
        written = dest / entry["file"]
        assert entry["sha256"] == _sha(written)  # the packed graph's hash, not its source's or another's
        files = [written] + ([written.with_name(written.name + "_data")] if entry["external_data"] else [])
        assert entry["bytes"] == sum(f.stat().st_size for f in files)
        assert entry["source"] == str(sources[dtype].resolve())
    assert by_dtype["fp32"]["file"] == "onnx/model.onnx" and by_dtype["q4"]["file"] == "onnx/model_q4.onnx"
    assert by_dtype["q4"]["recipe"] == "weight-only int4 b32 asym, emb int8"
    # an inline graph is copied byte for byte
    assert _sha(dest / "onnx/model.onnx") == _sha(sources["fp32"] / "model.onnx")
    assert by_dtype["fp32"]["external_data"] is False and by_dtype["q8"]["external_data"] is True
    assert by_dtype["fp32"]["manifest"] == sources["manifests"][0].to_dict()


def test_external_data_is_renamed_inside_the_graph(sources):
    dest = sources["root"] / "site"
    dest.mkdir()
    web.write_web_model([sources["q8"]], dest)
    graph = onnx.load(str(dest / "onnx/model_quantized.onnx"), load_external_data=False)
    (w,) = graph.graph.initializer
    assert {e.key: e.value for e in w.external_data}["location"] == "model_quantized.onnx_data"
    data = dest / "onnx/model_quantized.onnx_data"
    assert data.read_bytes() == (sources["q8"] / "model.onnx.data").read_bytes()
    loaded = onnx.load(str(dest / "onnx/model_quantized.onnx"))  # the renamed data is what the graph reads
    assert numpy_helper.to_array(loaded.graph.initializer[0]).tolist() == [[0, 1, 2], [3, 4, 5]]
    config = json.loads((dest / "config.json").read_text())
    assert config["transformers.js_config"] == {"dtype": "q8",
                                                "use_external_data_format": {"model_quantized.onnx": 1}}
    assert config["model_type"] == "gpt2"


def test_the_files_beside_the_graphs(sources):
    dest = sources["root"] / "site"
    dest.mkdir()
    pack = web.write_web_model([sources["q4"], sources["fp32"]], dest)
    assert pack["recommended"] == "q4"  # no q8 or int8: q4 next in the order
    assert json.loads((dest / "config.json").read_text())["transformers.js_config"] == {"dtype": "q4"}
    assert json.loads((dest / "tokenizer_config.json").read_text()) == {"model_max_length": 64,
                                                                         "clean_up_tokenization_spaces": False}
    for name in ("tokenizer.json", "generation_config.json"):
        assert (dest / name).read_bytes() == (sources["q4"] / name).read_bytes()
    (sources["fp32"] / "tokenizer_config.json").unlink()  # none: only the clean-up flag
    other = sources["root"] / "other"
    other.mkdir()
    web.write_web_model([sources["fp32"]], other)
    assert json.loads((other / "tokenizer_config.json").read_text()) == {"clean_up_tokenization_spaces": False}
    assert json.loads((other / "config.json").read_text())["transformers.js_config"] == {"dtype": "fp32"}


@pytest.mark.parametrize("recipes, recommended", [
    ((("weight-only", 4), ("weight-only", 8)), "int8"),  # int8 before q4
    ((None, ("static", 8)), "uint8"),  # uint8 before fp32
    (((None,),), "fp32"),
])
def test_the_recommended_dtype_is_the_best_packed(sources, recipes, recommended):
    fp32 = sources["manifests"][0]
    dirs = []
    for i, recipe in enumerate(recipes):
        manifest = fp32 if recipe in (None, (None,)) else dataclasses.replace(
            fp32, source=Source(fp32_source=Source(sha256=CHECKPOINT)),
            quantization=Quantization(method=recipe[0], bits=recipe[1]))
        dirs.append(_source(sources["root"], f"s{i}", manifest))
    dest = sources["root"] / "site"
    dest.mkdir()
    assert web.write_web_model(dirs, dest)["recommended"] == recommended
    assert json.loads((dest / "config.json").read_text())["transformers.js_config"]["dtype"] == recommended


def test_sources_that_are_not_one_model_are_refused(sources, tmp_path):
    fp32, q8, q4 = sources["manifests"]
    root = sources["root"]
    cases = [
        ([sources["fp32"], _source(root, "fp32b", fp32)], r"fp32b and .*fp32 are both transformers.js dtype 'fp32': "
                                                          r"pack them into separate folders$"),
        ([sources["fp32"], _source(root, "wide", dataclasses.replace(q8, shape=ModelShape("gpt2", 2, 4, 16, 100,
                                                                                            64)))],
         r"wide is not the same model as .*fp32 \(shape"),
        ([sources["fp32"], _source(root, "other", dataclasses.replace(q8, source=Source(sha256="cd" * 32)))],
         r"other and .*fp32 come from different checkpoints \(weights SHA-256 cdcdcdcdcdcdcdcd vs "
         r"abababababababab\): pack them into separate folders$"),
        ([sources["fp32"], _source(root, "unrecorded", dataclasses.replace(q8, source=Source()))],
         r"unrecorded and .*fp32 come from different checkpoints \(weights SHA-256 not recorded vs "
         r"abababababababab\)"),
        ([sources["fp32"], _source(root, "tok", q8, tokenizer='{"x": 1}')],
         r"tok and .*fp32 have different tokenizer.json files$"),
        ([_source(root, "kvb", dataclasses.replace(fp32, graph="kv_buffer"))], r"kvb: not web-ready: a kv_buffer"),
    ]
    for dirs, message in cases:  # each line starts with the source's path
        with pytest.raises(web.WebPackError, match=f"^{re.escape(str(root))}/{message}"):
            web.plan(dirs)
    (sources["q4"] / "tokenizer.json").unlink()
    with pytest.raises(web.WebPackError, match=r"q4/tokenizer.json: No such file or directory$"):
        web.plan([sources["fp32"], sources["q4"]])
    ort = _source(root, "ort", fp32)
    (ort / "model.onnx").write_bytes(b"\x00\x00\x00\x00ORTM" + b"\x00" * 16)
    with pytest.raises(web.WebPackError, match=r"ort: its graph model.onnx is in the ORT format \(a mobile pack\), "
                                               r"which onnxruntime-web does not load from a transformers.js folder: "
                                               r"pack the model dir it was made from$"):
        web.plan([ort])
    assert [g.dtype for g in web.plan([sources["q8"], sources["fp32"]])] == ["q8", "fp32"]


def test_a_contrib_op_outside_wasm_is_refused():
    node = helper.make_node("Attention", ["x"], ["y"], domain="com.microsoft")
    model = helper.make_model(helper.make_graph([node], "g", [], []))
    with pytest.raises(web.WebPackError, match=r"^g.onnx: uses Attention, which onnxruntime-web's WASM build lacks: "
                                               r"export with --plain-ops$"):
        web.check_ops(model, Path("g.onnx"))
    for op, domain in (("MatMulNBits", "com.microsoft"), ("Attention", "")):  # in WASM; a standard op's name
        web.check_ops(helper.make_model(helper.make_graph([helper.make_node(op, ["x"], ["y"], domain=domain)], "g",
                                                          [], [])), Path("g.onnx"))


def test_checkpoint_hash_through_the_fp32_source():
    assert web.checkpoint_sha256(Source(sha256="a")) == "a"
    assert web.checkpoint_sha256(Source(fp32_source=Source(sha256="b"))) == "b"
    assert web.checkpoint_sha256(Source(sha256="a", fp32_source=Source(sha256="b"))) == "a"
    assert web.checkpoint_sha256(Source()) is None
