"""Every claim of a manifest is checked: each field of gptedge.json given a value that must be refused,
and a graph that disagrees with its manifest in each way load() checks (names both ways, layers, heads, head
size, vocabulary, context). The README: "every claim in it is checked against the graph ... at load"."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from gptedge.runtime import load
from gptedge.runtime.errors import ModelDirError
from gptedge.runtime.checks.graph_check import manifest_from_hf_dir
from gptedge.runtime.modeldir.manifest import (FORMAT_VERSION, MANIFEST_NAME, Manifest, ModelShape, Quantization,
                                      QuantizedParity, Source, read_manifest)


@pytest.fixture(scope="module")
def written(gpt2_model_dir) -> dict:
    """The manifest export wrote, as JSON."""
    return json.loads((gpt2_model_dir / MANIFEST_NAME).read_text())


def edited(d: dict, path: str, value) -> dict:
    """A deep copy of d with the field at dotted `path` set (value DELETE: removed)."""
    d = copy.deepcopy(d)
    *parents, last = path.split(".")
    node = d
    for p in parents:
        node = node[p]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return d


DELETE = object()


@pytest.mark.parametrize("version, shown", [(DELETE, "None"), (4, "4"), (0, "0"), ("1", "'1'"), (None, "None"),
                                            (1.5, "1.5")])
def test_only_format_versions_1_to_3_are_read(written, version, shown):
    """2 is written unless the KV cache is not fp32 (then 3, test_kv_cache.py)."""
    assert FORMAT_VERSION == 2 and Manifest.from_dict(written).format_version == 2
    assert Manifest.from_dict(edited(written, "format_version", 1)).format_version == 1  # older dirs still read
    assert Manifest.from_dict(edited(written, "format_version", 3)).format_version == 3
    with pytest.raises(ModelDirError, match=f"^manifest format_version {shown} is not supported "
                                            "\\(this gptedge reads 1, 2 and 3\\)$"):
        Manifest.from_dict(edited(written, "format_version", version))
    with pytest.raises(ModelDirError, match="^manifest.format_version should be int, got True$"):
        Manifest.from_dict(edited(written, "format_version", True))  # True == 1 to Python, not to a manifest


BAD_FIELDS = [  # (dotted field, value, words of the one-line error)
    ("precision", "int3", "precision 'int3' is not one of fp32, fp16, int8, int4"),
    ("shape.arch", "mamba", "arch 'mamba' is not one of gpt2, openai-gpt, llama, gpt_neox, qwen2, mistral, gemma"),
    ("shape.n_layer", 0, "shape.n_layer should be a positive integer, got 0"),
    ("shape.n_head", -4, "shape.n_head should be a positive integer, got -4"),
    ("shape.context_length", "128", "manifest.shape.context_length should be int, got '128'"),
    ("shape.vocab_size", True, "manifest.shape.vocab_size should be int, got True"),
    ("shape.head_dim", 8.0, "manifest.shape.head_dim should be int, got 8.0"),
    ("shape.n_embd", 32, "manifest.shape has an unknown field 'n_embd'"),
    ("shape.n_head", DELETE, "manifest.shape is malformed"),
    ("shape", [], "manifest.shape should be an object, got list"),
    ("colour", "red", "manifest has an unknown field 'colour'"),
    ("graph", 3, "manifest.graph should be str, got 3"),
    ("eos_id", "50256", "manifest.eos_id should be int"),
    ("eos_id", False, "manifest.eos_id should be int, got False"),
    ("inputs", "input_ids", "manifest.inputs should be tuple"),
    ("inputs", ["input_ids", 3], "manifest.inputs should be str, got 3"),
    ("outputs", {"logits": 1}, "manifest.outputs should be tuple"),
    ("source.opset", "17", "manifest.source.opset should be int"),
    ("source.contrib_ops", [1], "manifest.source.contrib_ops should be str, got 1"),
    ("source.fp32_source", {"weights": 3}, "manifest.source.fp32_source.weights should be str, got 3"),
    ("parity.graph_vs_reference.max_abs_diff", "0", "manifest.parity.graph_vs_reference.max_abs_diff should be float"),
    ("parity.graph_vs_reference.max_abs_diff", True, "should be float, got True"),
    ("parity.graph_vs_reference.index", [0, "1"], "manifest.parity.graph_vs_reference.index should be int"),
    ("parity.greedy_vs_reference.identical", 1, "manifest.parity.greedy_vs_reference.identical should be bool, got 1"),
    ("parity.greedy_vs_reference.surprise", 1, "manifest.parity.greedy_vs_reference has an unknown field 'surprise'"),
    ("quantization", {"method": "dynamic", "quantized_nodes": {"MatMul": "2"}},
     "manifest.quantization.quantized_nodes should be int, got '2'"),
    ("quantization", {"method": "dynamic", "quantized_nodes": [1]},
     "manifest.quantization.quantized_nodes should be dict"),
    ("quantization", {"bits": 4}, "manifest.quantization is malformed"),
]


@pytest.mark.parametrize("field, value, says", BAD_FIELDS, ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(BAD_FIELDS)])
def test_each_field_is_checked(written, tmp_path, field, value, says):
    with pytest.raises(ModelDirError) as e:
        Manifest.from_dict(edited(written, field, value))
    message = str(e.value)
    assert message.startswith(says) or message.endswith(says), message
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(edited(written, field, value)))
    with pytest.raises(ModelDirError, match=f"^{tmp_path / MANIFEST_NAME}: "):  # read_manifest names the file
        read_manifest(tmp_path)


def test_values_of_the_right_type_pass_and_round_trip(written, tmp_path):
    m = Manifest.from_dict(edited(edited(written, "parity.graph_vs_reference.max_abs_diff", 0), "eos_id", None))
    assert m.parity.graph_vs_reference.max_abs_diff == 0.0 and isinstance(m.parity.graph_vs_reference.max_abs_diff,
                                                                          float)
    assert m.eos_id is None and isinstance(m.inputs, tuple) and isinstance(m.parity.graph_vs_reference.index, tuple)
    q = Manifest.from_dict(edited(written, "quantization", {"method": "dynamic", "quantized_nodes": {"MatMul": 4}}))
    assert q.quantization.quantized_nodes == {"MatMul": 4} and q.quantization.bits == 8
    # write_manifest also records the model files' sizes and hashes (tests/modeldir/test_model_integrity.py); the JSON
    # itself
    # round-trips through to_dict / read_manifest
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(m.to_dict()))
    assert read_manifest(tmp_path) == m and read_manifest(tmp_path).to_dict() == m.to_dict()


def test_unreadable_manifests(tmp_path):
    with pytest.raises(ModelDirError) as e:
        read_manifest(tmp_path)
    assert str(e.value) == f"{tmp_path}: no gptedge.json (not a gptedge model directory)"
    for text, says in ((b"{not json", "corrupt manifest (Expecting"),
                       (b"\xff\xfe{}", "corrupt manifest ('utf-8' codec"),
                       (b"[1, 2]", "corrupt manifest (no 'shape')"),
                       (b'{"format_version": 1}', "corrupt manifest (no 'shape')")):
        (tmp_path / MANIFEST_NAME).write_bytes(text)
        with pytest.raises(ModelDirError) as e:
            read_manifest(tmp_path)
        assert str(e.value).startswith(f"{tmp_path / MANIFEST_NAME}: {says}") and str(e.value).endswith(")")


def test_defaults_labels_and_the_checkpoint_behind_a_dir():
    shape = ModelShape("gpt2", 2, 4, 8, 100, 16)
    m = Manifest(shape)
    assert m.inputs[:3] == ("input_ids", "attention_mask", "position_ids") and len(m.inputs) == 3 + 4
    assert m.outputs == ("logits", "present.0.key", "present.0.value", "present.1.key", "present.1.value")
    assert Manifest(shape, inputs=("a",), outputs=("b",)).inputs == ("a",)
    assert (m.precision, m.graph, m.model_file, m.format_version, m.quantization) == \
        ("fp32", "standard", "model.onnx", FORMAT_VERSION, None)
    assert shape.n_embd == 32
    assert Quantization("dynamic").label == "dynamic"
    assert Quantization("weight-only", float16=True).label == "weight-only, fp16 activations"
    assert Quantization("fp16", bits=16).label == "fp16"
    assert Quantization("weight-only", bits=4, block_size=64,
                        symmetric=False).label == "weight-only int4 b64 asym, emb int8"
    assert Quantization("weight-only", bits=4, symmetric=True, embedding_bits=4).label == "weight-only int4 b32 sym"
    assert Quantization("weight-only", bits=8, embedding_bits=4).label == "weight-only int8 b32 asym, emb int4"
    assert Source(path="/ck").checkpoint == "/ck"
    assert Source(quantized_from="/fp32", fp32_source=Source(path="/ck")).checkpoint == "/ck"
    assert Source().checkpoint is None and Source(fp32_source=Source()).checkpoint is None


def test_the_defaults_a_manifest_records():
    assert Source().imported_from is None and Source().path is None and Source().contrib_ops == ()
    assert QuantizedParity(0.1, 0.9, "ids").device == "cpu" and QuantizedParity(0.1, 0.9,
                                                                                "ids").greedy_agreement is None
    q = Quantization("dynamic")
    assert (q.weights, q.activations, q.embedding_and_lm_head, q.kept_float, q.attention_products,
            q.quantized_nodes) == \
        ("", "", "", "", "float", {})
    m = Manifest(ModelShape("gpt2", 1, 1, 1, 2, 2), inputs=("input_ids",))
    assert m.outputs == () and m.to_dict()["outputs"] == [] and m.to_dict()["source"]["imported_from"] is None


# -- the graph against its manifest -------------------------------------------------------------------------------
def dir_with(src: Path, dst: Path, change) -> Path:
    shutil.copytree(src, dst)
    d = json.loads((dst / MANIFEST_NAME).read_text())
    change(d)
    (dst / MANIFEST_NAME).write_text(json.dumps(d))
    # config.json says what the manifest says (load checks the two agree first), so the graph is what disagrees
    cfg, shape = json.loads((dst / "config.json").read_text()), d["shape"]
    cfg.update(n_layer=shape["n_layer"], n_head=shape["n_head"], n_embd=shape["n_head"] * shape["head_dim"],
               vocab_size=shape["vocab_size"], n_positions=shape["context_length"])
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _drop(key: str, name: str):
    return lambda d: d[key].remove(name)


MISMATCHES = [
    ("an-input-the-manifest-omits", _drop("inputs", "position_ids"), "it has unexpected input 'position_ids'"),
    ("an-input-the-graph-lacks", lambda d: d["inputs"].append("token_type_ids"), "it lacks input 'token_type_ids'"),
    ("an-output-the-manifest-omits", _drop("outputs", "present.1.value"), "it has unexpected output 'present.1.value'"),
    ("an-output-the-graph-lacks", lambda d: d["outputs"].append("hidden"), "it lacks output 'hidden'"),
    ("layers", lambda d: d["shape"].update(n_layer=3), "says n_layer 3, the graph has 2 layers"),
    ("heads", lambda d: d["shape"].update(n_head=8, head_dim=4), "says n_head 8, the graph has 4"),
    ("head-size", lambda d: d["shape"].update(head_dim=16), "says head_dim 16, the graph has 8"),
    # the tokenizer beside the graph is checked against the claimed vocabulary first
    ("vocabulary", lambda d: d["shape"].update(vocab_size=50000), "the model's vocabulary is 50,000"),
    ("context", lambda d: d["shape"].update(context_length=129),
     "gptedge.json says context_length 129, the graph's position table holds 128 positions"),
]


@pytest.mark.parametrize("change, says", [m[1:] for m in MISMATCHES], ids=[m[0] for m in MISMATCHES])
def test_a_graph_that_disagrees_with_its_manifest_is_refused_at_load(gpt2_model_dir, tmp_path, change, says):
    bad = dir_with(gpt2_model_dir, tmp_path / "m", change)
    with pytest.raises(ModelDirError) as e:
        load(bad, device="cpu")
    message = str(e.value)
    assert message.startswith((f"{bad / 'model.onnx'}: ", f"{bad}: ")) and says in message


def test_a_manifest_that_claims_less_context_is_refused_too(gpt2_model_dir, tmp_path):
    bad = dir_with(gpt2_model_dir, tmp_path / "m", lambda d: d["shape"].update(context_length=64))
    with pytest.raises(ModelDirError, match="says context_length 64, the graph's position table holds 128 positions"):
        load(bad, device="cpu")  # the manifest's context is the position table's size, never less


def test_a_gptedge_graph_whose_manifest_is_gone(gpt2_model_dir, tmp_path):
    shutil.copytree(gpt2_model_dir, tmp_path / "m")
    (tmp_path / "m" / MANIFEST_NAME).unlink()
    with pytest.raises(ModelDirError) as e:
        load(tmp_path / "m", device="cpu")
    assert str(e.value) == (f"{tmp_path / 'm'}: no gptedge.json, yet gptedge wrote this graph: its manifest is missing "
                            "(restore it, or export / quantize again)")


def test_a_dir_from_another_exporter_is_described_by_its_config(tmp_path):
    with pytest.raises(ModelDirError) as e:
        manifest_from_hf_dir(tmp_path)
    assert str(e.value) == f"{tmp_path}: no gptedge.json and no config.json (not a model directory)"
    cfg = {"model_type": "gpt2", "n_layer": 2, "n_head": 4, "n_embd": 32, "vocab_size": 100, "n_positions": 16,
           "eos_token_id": 7, "bos_token_id": 5}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = manifest_from_hf_dir(tmp_path)
    assert m.shape == ModelShape("gpt2", 2, 4, 8, 100, 16)
    assert (m.eos_id, m.bos_id, m.pad_id, m.source.imported_from) == (7, 5, None, "config.json")
    assert len(m.inputs) == 3 + 4 and len(m.outputs) == 1 + 4
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 9, "pad_token_id": 3}))
    m = manifest_from_hf_dir(tmp_path)
    assert (m.eos_id, m.pad_id) == (9, 3)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [9, 10]}))
    assert manifest_from_hf_dir(tmp_path).eos_id is None  # a list of eos ids: none the runtime can use
    for broken in ({k: v for k, v in cfg.items() if k != "n_head"}, {**cfg, "n_embd": None}):
        (tmp_path / "config.json").write_text(json.dumps(broken))
        with pytest.raises(ModelDirError) as e:
            manifest_from_hf_dir(tmp_path)
        assert str(e.value).startswith(f"{tmp_path / 'config.json'}: cannot read the model's shape (")
    (tmp_path / "config.json").write_text("{oops")
    with pytest.raises(ModelDirError, match="config.json: cannot read the model's shape \\(JSONDecodeError"):
        manifest_from_hf_dir(tmp_path)
