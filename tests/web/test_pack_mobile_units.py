"""`pack --target mobile` (gptedge/pack/mobile.py) over a tiny synthetic dir: onnxruntime's converter run for real
on a one-node graph, the model-dir pipeline replaced by the manifest made here. Asserted as a user reads them: the
platform the converter was asked for, gptedge-pack.json's bytes and operators, the files beside model.ort, the
operator config's header naming model.ort. (test_pack_mobile.py packs real model dirs.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from gptedge.pack import mobile
from gptedge.runtime.modeldir.manifest import MANIFEST_NAME, Manifest, ModelShape

MANIFEST = Manifest(ModelShape("gpt2", 2, 4, 8, 100, 64))


@pytest.fixture()
def source(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "src"
    d.mkdir()
    weight = numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], [weight])
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(d / "model.onnx"))
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        (d / name).write_text(json.dumps({"name": name}))
    (d / "genai_config.json").write_text(json.dumps({"model": {"decoder": {"filename": "model.onnx"}, "x": 1}}))
    monkeypatch.setattr(mobile, "check_model_dir", lambda path: MANIFEST)
    # the synthetic graph cannot run: the golden self-test (tests/web/test_pack_selftest.py) records a stand-in
    monkeypatch.setattr(mobile, "graph_entry", lambda source, manifest, dtype, file_name, target: {"file": file_name})
    return d


@pytest.mark.parametrize("platform", ["arm", "amd64"])
def test_a_mobile_pack_is_converted_for_its_platform_and_records_what_it_wrote(source, tmp_path, monkeypatch,
                                                                               platform):
    asked = []
    real = mobile.convert_onnx_models_to_ort

    def spy(*args, **kwargs):
        asked.append(kwargs["target_platform"])
        return real(*args, **kwargs)

    monkeypatch.setattr(mobile, "convert_onnx_models_to_ort", spy)
    dest = tmp_path / "out"
    dest.mkdir()
    pack = mobile.write_mobile_model(source, dest, platform)
    assert asked == [platform]
    assert json.loads((dest / "gptedge-pack.json").read_text()) == pack
    assert (pack["format"], pack["target"], pack["platform"], pack["model"]) == (1, "mobile", platform, "model.ort")
    assert pack["bytes"] == (dest / "model.ort").stat().st_size and (dest / "model.ort").read_bytes()[4:8] == b"ORTM"
    assert pack["operators"] == ["ai.onnx:MatMul", "ai.onnx:Relu"]
    assert pack["converter"] == (f"onnxruntime {onnxruntime.__version__} convert_onnx_models_to_ort (optimization "
                                 "style Fixed, level all, type reduction)")
    assert (pack["source"], pack["source_manifest"], pack["operators_config"]) == (
        str(source.resolve()), MANIFEST_NAME, "required_operators_and_types.config")
    config = (dest / "required_operators_and_types.config").read_text()
    assert "model.ort" in config and str(dest) not in config  # the header names the packed file, not a scratch path
    assert sorted(p.name for p in dest.iterdir()) == [
        "config.json", "genai_config.json", "generation_config.json", "gptedge-pack.json", "gptedge-selftest.json",
        MANIFEST_NAME,
        "model.ort", "required_operators_and_types.config", "tokenizer.json", "tokenizer_config.json"]
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (dest / name).read_bytes() == (source / name).read_bytes()
    assert json.loads((dest / "genai_config.json").read_text()) == {"model": {"decoder": {"filename": "model.ort"},
                                                                              "x": 1}}
    assert json.loads((dest / MANIFEST_NAME).read_text())["model_file"] == "model.ort"


def test_a_dir_without_genai_config_packs_without_one(source, tmp_path):
    (source / "genai_config.json").unlink()
    (source / "tokenizer_config.json").unlink()
    dest = tmp_path / "out"
    dest.mkdir()
    mobile.write_mobile_model(source, dest)
    assert not (dest / "genai_config.json").exists() and not (dest / "tokenizer_config.json").exists()
    assert json.loads((dest / "gptedge-pack.json").read_text())["platform"] == "arm"  # the default


def test_what_the_ort_format_cannot_hold_is_refused(source, tmp_path, monkeypatch):
    assert mobile.ORT_FORMAT_LIMIT == 2**31 - 1  # a flatbuffer's 2 GB
    dest = tmp_path / "out"
    dest.mkdir()
    size = (source / "model.onnx").stat().st_size
    monkeypatch.setattr(mobile, "ORT_FORMAT_LIMIT", size)  # exactly the limit: converted
    mobile.write_mobile_model(source, dest)
    monkeypatch.setattr(mobile, "ORT_FORMAT_LIMIT", size - 1)  # a byte over: refused before converting
    with pytest.raises(mobile.MobilePackError, match=r"src: 0.00 GB of graph and weights; the ORT format holds at "
                                                     r"most 2 GB: quantize it first$"):
        mobile.write_mobile_model(source, tmp_path)
    (source / "model.onnx").write_bytes((dest / "model.ort").read_bytes())
    with pytest.raises(mobile.MobilePackError, match=r"its graph model.onnx is already in the ORT format"):
        mobile.write_mobile_model(source, tmp_path)
    (source / "model.onnx").write_bytes(b"not a graph")
    with pytest.raises(mobile.MobilePackError, match=rf"^{re.escape(str(source))}/model.onnx: onnxruntime's ORT "
                                                     r"format converter failed: \S"):
        mobile.write_mobile_model(source, tmp_path / "x")


def test_the_operators_config_is_read_as_domain_and_op(tmp_path):
    config = tmp_path / "ops.config"
    config.write_text("# generated from model.ort\n\nai.onnx;17;MatMul{\"inputs\": {\"0\": [\"float\", \"int8\"]}},"
                      "Relu\ncom.microsoft;1;MatMulNBits,Gelu\nai.onnx;13;Relu\n")
    assert mobile._operators(config) == ["ai.onnx:MatMul", "ai.onnx:Relu", "com.microsoft:Gelu",
                                         "com.microsoft:MatMulNBits"]


def test_the_size_limit_counts_the_graph_and_its_external_data(source, tmp_path, monkeypatch):
    weight = numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], [weight])
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(source / "model.onnx"),
                    save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    both = (source / "model.onnx").stat().st_size + (source / "model.onnx.data").stat().st_size
    monkeypatch.setattr(mobile, "ORT_FORMAT_LIMIT", both - 1)  # the graph alone fits; with its data it does not
    with pytest.raises(mobile.MobilePackError, match="the ORT format holds at most 2 GB"):
        mobile.write_mobile_model(source, tmp_path)
