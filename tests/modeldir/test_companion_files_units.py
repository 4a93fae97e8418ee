"""The files other engines read beside the graph, against the manifest (runtime/checks/companion_files.py):
genai_config.json, tokenizer_config.json, config.json's id2label and chat_template.jinja, on hand-made manifests
in a temporary folder. Each problem as verify prints it; limits on both sides (the context exactly and one past it).
No model is built."""

from __future__ import annotations

import json

import pytest

from gptedge.runtime.checks.companion_files import companion_problems, read_json
from gptedge.runtime.modeldir.manifest import Manifest, ModelShape
from gptedge.runtime.modeldir.tasks import Task, transformation

SHAPE = ModelShape("gpt2", 2, 4, 8, 100, 64)
M = Manifest(SHAPE, eos_id=50, bos_id=50)


def genai(**change) -> dict:
    g = {"model": {"eos_token_id": 50, "bos_token_id": 50, "context_length": 64,
                   "decoder": {"filename": "model.onnx"}},
         "search": {"max_length": 64, "past_present_share_buffer": False}}
    for key, value in change.items():
        part, name = key.split("__")
        g[part][name] = value
    return g


def write(d, name, data) -> None:
    (d / name).write_text(data if isinstance(data, str) else json.dumps(data))


def found(d, m=M, config=None) -> list[str]:
    return companion_problems(d, m, config or {})


def test_no_files_and_files_that_agree_have_no_problem(tmp_path):
    assert found(tmp_path) == []
    write(tmp_path, "genai_config.json", genai())
    write(tmp_path, "tokenizer_config.json", {"model_max_length": 64})
    assert found(tmp_path) == []


@pytest.mark.parametrize("key, value, line", [
    ("model__eos_token_id", 7, "gptedge.json says eos_id 50, genai_config.json says model.eos_token_id 7"),
    ("model__bos_token_id", 3, "gptedge.json says bos_id 50, genai_config.json says model.bos_token_id 3"),
    ("model__context_length", 128,
     "gptedge.json says context_length 64, genai_config.json says model.context_length 128"),
    ("model__decoder", {"filename": "other.onnx"},
     "gptedge.json says model_file model.onnx, genai_config.json says model.decoder.filename other.onnx"),
    ("search__past_present_share_buffer", True,
     "gptedge.json says graph standard, genai_config.json says past_present_share_buffer true"),
])
def test_each_genai_field_that_disagrees_is_one_line(tmp_path, key, value, line):
    write(tmp_path, "genai_config.json", genai(**{key: value}))
    assert found(tmp_path) == [line]


def test_genai_takes_a_list_of_end_ids_and_absent_fields_agree_with_absent_claims(tmp_path):
    write(tmp_path, "genai_config.json", genai(model__eos_token_id=[50, 51]))
    assert found(tmp_path) == []
    write(tmp_path, "genai_config.json", genai(model__eos_token_id=[51, 52]))
    assert found(tmp_path) == ["gptedge.json says eos_id 50, genai_config.json says model.eos_token_id [51, 52]"]
    g = genai()
    del g["model"]["bos_token_id"]
    write(tmp_path, "genai_config.json", g)
    assert found(tmp_path, Manifest(SHAPE, eos_id=50)) == []  # no bos claimed, none in the file
    assert found(tmp_path) == ["gptedge.json says bos_id 50, genai_config.json says model.bos_token_id None"]
    write(tmp_path, "genai_config.json", genai())
    assert found(tmp_path, Manifest(SHAPE, eos_id=50)) == [
        "gptedge.json says bos_id None, genai_config.json says model.bos_token_id 50"]


def test_genai_sections_that_are_not_objects_read_as_empty(tmp_path):
    write(tmp_path, "genai_config.json", {"model": [1], "search": "x"})
    assert found(tmp_path) == [
        "gptedge.json says eos_id 50, genai_config.json says model.eos_token_id None",
        "gptedge.json says bos_id 50, genai_config.json says model.bos_token_id None",
        "gptedge.json says context_length 64, genai_config.json says model.context_length None",
        "gptedge.json says model_file model.onnx, genai_config.json says model.decoder.filename None"]
    write(tmp_path, "genai_config.json", genai(model__decoder="model.onnx"))
    assert found(tmp_path) == [
        "gptedge.json says model_file model.onnx, genai_config.json says model.decoder.filename None"]


@pytest.mark.parametrize("longest, ok", [(64, True), (63, True), (65, False), ("999", True)])
def test_search_max_length_up_to_the_context(tmp_path, longest, ok):
    write(tmp_path, "genai_config.json", genai(search__max_length=longest))
    assert found(tmp_path) == ([] if ok else [
        "genai_config.json says search.max_length 65, past the model's context 64"])


def test_the_shared_buffer_flag_against_the_graph_variant(tmp_path):
    kvb = Manifest(SHAPE, eos_id=50, bos_id=50, graph="kv_buffer")
    write(tmp_path, "genai_config.json", genai(search__past_present_share_buffer=True))
    assert found(tmp_path, kvb) == []
    write(tmp_path, "genai_config.json", genai(search__past_present_share_buffer=0))
    assert found(tmp_path, kvb) == [
        "gptedge.json says graph kv_buffer, genai_config.json says past_present_share_buffer false"]
    g = genai()
    del g["search"]["past_present_share_buffer"]
    write(tmp_path, "genai_config.json", g)
    assert found(tmp_path, kvb) == [] and found(tmp_path) == []


@pytest.mark.parametrize("longest, ok", [(64, True), (None, True), (63, False), (65, False)])
def test_tokenizer_config_model_max_length_is_the_context(tmp_path, longest, ok):
    write(tmp_path, "tokenizer_config.json", {"model_max_length": longest})
    assert found(tmp_path) == ([] if ok else [
        f"gptedge.json says context_length 64, tokenizer_config.json says model_max_length {longest}"])


def test_files_that_are_not_json_objects_are_one_line_each(tmp_path):
    write(tmp_path, "genai_config.json", "{nope")
    write(tmp_path, "tokenizer_config.json", "[1, 2]")
    lines = found(tmp_path)
    assert lines[0].startswith("genai_config.json cannot be read as JSON (JSONDecodeError: Expecting property name")
    assert lines[1:] == ["tokenizer_config.json is not a JSON object"]
    assert read_json(tmp_path / "absent.json") is None
    write(tmp_path, "x.json", {"a": 1})
    assert read_json(tmp_path / "x.json") == {"a": 1}
    (tmp_path / "bad.json").write_bytes(b"\xff\xfe")
    assert read_json(tmp_path / "bad.json").startswith("bad.json cannot be read as JSON (UnicodeDecodeError: ")
    write(tmp_path, "long.json", "{" + "x" * 300)
    assert len(read_json(tmp_path / "long.json")) < 160


def classifier(labels: dict) -> Manifest:
    return Manifest(SHAPE, eos_id=50, bos_id=50,
                    task=Task("classification", "sequence-classification", transformation("classification"),
                              id2label=labels))


def test_config_id2label_against_the_manifests_labels(tmp_path):
    m = classifier({"0": "neg", "1": "pos"})
    assert found(tmp_path, m, {"id2label": {"0": "neg", "1": "pos"}}) == []
    assert found(tmp_path, m, {"id2label": {0: "neg", 1: "pos"}}) == []  # int keys (a dict made in Python) agree
    assert found(tmp_path, m, {"id2label": {"0": "pos", "1": "neg"}}) == [
        "gptedge.json says the labels are ['neg', 'pos'], config.json's id2label says ['pos', 'neg']"]
    assert found(tmp_path, m, {"id2label": ["neg", "pos"]}) == [
        "gptedge.json says the labels are ['neg', 'pos'], config.json's id2label says ['neg', 'pos']"]
    assert found(tmp_path, m, {}) == []  # config.json without id2label: nothing to compare
    assert found(tmp_path, classifier({}), {"id2label": {"0": "x"}}) == []  # the manifest records none
    assert found(tmp_path, M, {"id2label": {"0": "x"}}) == []  # a language model


def test_a_chat_template_that_does_not_parse_is_one_line(tmp_path):
    pytest.importorskip("jinja2", reason="chat templates are read with the serve extra's jinja2")
    write(tmp_path, "chat_template.jinja", "{% for m in messages %}{{ m.content }}{% endfor %}")
    assert found(tmp_path) == []
    write(tmp_path, "chat_template.jinja", "{% for m in messages %}{{ m.content }}")
    lines = found(tmp_path)
    assert len(lines) == 1 and lines[0].startswith("chat_template.jinja: the chat template does not parse: ")
    assert "\n" not in lines[0]


def test_every_file_is_checked_in_order(tmp_path):
    write(tmp_path, "genai_config.json", genai(model__eos_token_id=7))
    write(tmp_path, "tokenizer_config.json", {"model_max_length": 1024})
    m = classifier({"0": "a"})
    lines = found(tmp_path, m, {"id2label": {"0": "b"}})
    assert [ln.split(",")[1].split()[0] for ln in lines] == [
        "genai_config.json", "tokenizer_config.json", "config.json's"]
