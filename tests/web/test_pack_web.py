"""`gptedge pack --target web`: transformers.js' layout, the graphs unchanged, external data renamed, refusals,
and `gptedge info`'s web readiness. (The Node and Chromium clients that run the result: test_web_node.py,
test_web_browser.py.)"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from gptedge.pack.web import WebPackError, write_web_model
from gptedge.runtime import load
from gptedge.runtime.modeldir.manifest import read_manifest, write_manifest
from gptedge.runtime.modeldir.web_ready import web_readiness

from ..support.cli import run_gptedge

pytestmark = pytest.mark.slow  # the sample model in four recipes, packed and run by real clients

EXPECTED = {"fp32": "onnx/model.onnx", "dynamic": "onnx/model_quantized.onnx", "w8": "onnx/model_int8.onnx",
            "w4": "onnx/model_q4.onnx"}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def packed(sample_recipe_dirs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("web") / "pack"
    done = run_gptedge("pack", *(str(d) for d in sample_recipe_dirs.values()), "--target", "web", "-o", str(out),
                   "--no-page")
    assert done.returncode == 0, done.stderr
    return out


def test_layout_is_transformers_js(packed, sample_recipe_dirs):
    pack = json.loads((packed / "gptedge-pack.json").read_text())
    assert {m["dtype"]: m["file"] for m in pack["models"]} == {
        "fp32": EXPECTED["fp32"], "q8": EXPECTED["dynamic"], "int8": EXPECTED["w8"], "q4": EXPECTED["w4"]}
    for name, source in sample_recipe_dirs.items():  # the graphs themselves, byte for byte
        assert sha256(packed / EXPECTED[name]) == sha256(source / "model.onnx"), name
    config = json.loads((packed / "config.json").read_text())
    assert config["model_type"] == "gpt2"
    assert config["transformers.js_config"] == {"dtype": "q8"}  # the recommended web recipe is the default dtype
    assert json.loads((packed / "tokenizer_config.json").read_text())["clean_up_tokenization_spaces"] is False
    for name in ("generation_config.json", "tokenizer.json"):
        assert (packed / name).read_bytes() == (sample_recipe_dirs["fp32"] / name).read_bytes()
    assert not (packed / "playground").exists()  # --no-page


def test_golden_self_test_is_the_python_runtimes(packed, sample_recipe_dirs):
    """gptedge-selftest.json: per graph, the Python runtime's greedy ids and top logits, the tolerance by what the
    browser's kernel computes, and the accuracy-level caveat on weight-only graphs."""
    from gptedge.pack.selftest import FLOAT_TOLERANCE, INT8_TOLERANCE, SELFTEST_FILE

    pack = json.loads((packed / "gptedge-pack.json").read_text())
    golden = json.loads((packed / SELFTEST_FILE).read_text())
    assert [(g["dtype"], g["file"]) for g in golden["graphs"]] == [(m["dtype"], m["file"]) for m in pack["models"]]
    assert {g["dtype"]: (g["tolerance"], "accuracy level 4" in g.get("caveat", "")) for g in golden["graphs"]} == {
        "fp32": (FLOAT_TOLERANCE, False), "q8": (INT8_TOLERANCE, False), "int8": (FLOAT_TOLERANCE, True),
        "q4": (FLOAT_TOLERANCE, True)}
    q4 = golden["graphs"][3]["cases"][0]
    want = load(sample_recipe_dirs["w4"], device="cpu").generate(q4["prompt"], max_new_tokens=8, greedy=True)
    assert (q4["prompt_ids"], q4["ids"]) == (want.prompt_ids, want.ids)
    assert [step[0][0] for step in q4["top"]] == want.ids and len(q4["top"][0]) == 5


def test_external_data_is_renamed_for_transformers_js(sample_recipe_dirs, tmp_path):
    """A source keeping its weights in model.onnx.data: the pack has onnx/model.onnx_data (transformers.js' name),
    the graph points at it, config.json says so, and ONNX Runtime gives the source's logits from it."""
    import onnxruntime as ort

    source = tmp_path / "ext"
    source.mkdir()
    for f in sample_recipe_dirs["fp32"].iterdir():
        if f.name != "model.onnx":
            (source / f.name).write_bytes(f.read_bytes())
    model = onnx.load(str(sample_recipe_dirs["fp32"] / "model.onnx"))
    onnx.save_model(model, str(source / "model.onnx"), save_as_external_data=True, location="model.onnx.data",
                    size_threshold=1024)
    write_manifest(source, read_manifest(source))  # its files recorded again, as gptedge records what it writes
    out = tmp_path / "pack"
    out.mkdir()
    write_web_model([source], out)
    assert (out / "onnx" / "model.onnx_data").read_bytes() == (source / "model.onnx.data").read_bytes()
    graph = onnx.load(str(out / "onnx" / "model.onnx"), load_external_data=False)
    locations = {e.value for t in graph.graph.initializer for e in t.external_data if e.key == "location"}
    assert locations == {"model.onnx_data"}
    config = json.loads((out / "config.json").read_text())
    assert config["transformers.js_config"]["use_external_data_format"] == {"model.onnx": 1}
    feeds = {"input_ids": np.array([[5, 6, 7]], np.int64), "attention_mask": np.ones((1, 3), np.int64),
             "position_ids": np.arange(3, dtype=np.int64)[None]}
    shape = read_manifest(source).shape
    for i in range(shape.n_layer):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.{kind}"] = np.zeros((1, shape.n_head, 0, shape.head_dim), np.float32)
    packed_logits = ort.InferenceSession(str(out / "onnx" / "model.onnx")).run(["logits"], feeds)[0]
    source_logits = ort.InferenceSession(str(sample_recipe_dirs["fp32"] / "model.onnx")).run(["logits"], feeds)[0]
    np.testing.assert_array_equal(packed_logits, source_logits)


def test_refusals(sample_recipe_dirs, gpt2_kv_buffer_loaded, tmp_path):
    kvb = gpt2_kv_buffer_loaded.model_dir
    with pytest.raises(WebPackError, match="kv_buffer graph"):
        write_web_model([kvb], tmp_path)
    with pytest.raises(WebPackError, match="both transformers.js dtype 'fp32'"):
        write_web_model([sample_recipe_dirs["fp32"], sample_recipe_dirs["fp32"]], tmp_path)
    assert not any(tmp_path.iterdir())  # checked before anything is written
    done = run_gptedge("pack", str(kvb), "--target", "web", "-o", str(tmp_path / "o"), "--no-page")
    assert done.returncode == 1 and done.stderr.startswith("Error: ") and "--graph standard" in done.stderr
    assert not (tmp_path / "o").exists()
    done = run_gptedge("pack", str(sample_recipe_dirs["fp32"]), str(sample_recipe_dirs["w4"]), "--target", "mobile",
                   "-o", str(tmp_path / "m"))
    assert done.returncode == 2 and "one MODEL" in done.stderr
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("mine")
    done = run_gptedge("pack", str(sample_recipe_dirs["fp32"]), "--target", "web", "-o", str(tmp_path / "taken"),
                   "--no-page", "--force")
    assert done.returncode == 2 and (tmp_path / "taken" / "x").read_text() == "mine"


def test_force_replaces_a_pack(sample_recipe_dirs, tmp_path):
    out = tmp_path / "pack"
    done = run_gptedge("pack", str(sample_recipe_dirs["w4"]), "--target", "web", "-o", str(out), "--no-page")
    assert done.returncode == 0, done.stderr
    assert run_gptedge("pack", str(sample_recipe_dirs["fp32"]), "--target", "web", "-o", str(out),
                   "--no-page").returncode == 2  # exists, no --force
    done = run_gptedge("pack", str(sample_recipe_dirs["fp32"]), "--target", "web", "-o", str(out), "--no-page",
                       "--force")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (out / "onnx").iterdir()) == ["model.onnx"]


def test_readiness_names_the_dtype(sample_recipe_dirs, gpt2_kv_buffer_loaded):
    found = {name: web_readiness(read_manifest(d)) for name, d in sample_recipe_dirs.items()}
    assert {n: (r.ready, r.dtype) for n, r in found.items()} == {
        "fp32": (True, "fp32"), "dynamic": (True, "q8"), "w8": (True, "int8"), "w4": (True, "q4")}
    kvb = web_readiness(gpt2_kv_buffer_loaded.manifest)
    assert not kvb.ready and "kv_buffer" in kvb.reason
    done = run_gptedge("info", str(sample_recipe_dirs["w4"]), "--device", "cpu")
    info = json.loads(done.stdout)
    assert info["web_ready"] is True and "'q4'" in info["web"]
