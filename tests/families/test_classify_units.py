"""The classifier runtime's plumbing (runtime/classify.py) on a stand-in ONNX Runtime session: rows padded on the
right and read at their last attended token, batches of rows (and of multiple-choice examples) of the size asked,
similarity's two rows added, labels and probabilities as a user reads them, the argument checks, the calibration
feeds, and check_head_graph's one-line refusals. No graph is exported (test_task_heads.py runs real classifier
dirs against transformers)."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest

from gptedge.runtime import classify as cl
from gptedge.runtime.classify import Classification, Classifier, HeadFeeds, check_head_graph, pad_rows, softmax
from gptedge.runtime.errors import InvalidArgumentError, ModelDirError
from gptedge.runtime.modeldir.manifest import Manifest, ModelShape
from gptedge.runtime.modeldir.tasks import HEAD_CHOICE, HEAD_SEQUENCE, SpecialTokens, Task, transformation

from ..support.checkpoints import ROOT

SHAPE = ModelShape("gpt2", 2, 4, 8, 50257, 64)
TOKENS = SpecialTokens(start=50254, delimiter=50255, extract=50256)
IO = dict(inputs=("input_ids", "attention_mask"), outputs=("logits",))


class Session:
    """Logits from each row's last attended token t: a sequence head gives (t, -t, t % 7) / 1000 per row; a
    multiple-choice head t / 1000 per choice. Every run's input shapes are recorded."""

    def __init__(self, out_shape=None, fails=None):
        self.runs, self.out_shape, self.fails = [], out_shape, fails

    def get_providers(self):
        return ["CPUExecutionProvider"]

    def get_inputs(self):
        return [SimpleNamespace(name="attention_mask"), SimpleNamespace(name="input_ids")]

    def get_outputs(self):
        return [SimpleNamespace(name="logits")]

    def run(self, names, feeds):
        if self.fails:
            raise RuntimeError(self.fails)
        ids, mask = feeds["input_ids"], feeds["attention_mask"]
        assert ids.dtype == np.int64 and mask.dtype == np.int64 and ids.shape == mask.shape
        self.runs.append(ids.shape)
        if self.out_shape is not None:
            return [np.zeros(self.out_shape, np.float64)]
        last = np.take_along_axis(ids, mask.sum(-1, keepdims=True) - 1, axis=-1)[..., 0].astype(np.float64)
        if ids.ndim == 3:
            return [last / 1000]
        return [np.stack([last, -last, last % 7], axis=-1) / 1000]


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(ROOT / "samples" / "sample-model" / "tokenizer.json"))


def classifier(name: str, tokenizer, session=None, **task_change) -> Classifier:
    head = HEAD_CHOICE if name == "multiple-choice" else HEAD_SEQUENCE
    task = Task(name, head, transformation(name), TOKENS, id2label={"0": "no", "1": "yes", "2": "maybe"}, pad_id=7)
    task = dataclasses.replace(task, **task_change)
    return Classifier(ROOT, Manifest(SHAPE, task=task, **IO), session or Session(), "cpu", 0.5, tokenizer)


def test_classification_reads_as_a_user_reads_it():
    c = Classification(("no", "yes"), (0.5, 2.0), (0.18, 0.82))
    assert (c.index, c.label) == (1, "yes")
    assert c.to_dict() == {"label": "yes", "index": 1, "probabilities": {"no": 0.18, "yes": 0.82},
                           "labels": ["no", "yes"], "logits": [0.5, 2.0]}
    m = Classification(("a", "a", "b"), (3.0, 1.0, 2.0), (0.6, 0.1, 0.3), choices=True)
    assert m.to_dict()["probabilities"] == [0.6, 0.1, 0.3] and (m.index, m.label) == (0, "a")


def test_softmax_is_stable_and_sums_to_one_in_float64():
    p = softmax(np.array([[1000.0, 1000.0, 999.0], [0.0, 0.0, 0.0]], np.float32))
    assert p.dtype == np.float64 and np.allclose(p.sum(-1), 1.0)
    e = math.exp(-1)
    np.testing.assert_allclose(p[0], [1 / (2 + e), 1 / (2 + e), e / (2 + e)])
    np.testing.assert_allclose(p[1], [1 / 3] * 3)


def test_rows_are_right_padded_with_a_mask_of_their_length():
    ids, mask = pad_rows([[5, 6, 7], [8]], pad_id=0)
    np.testing.assert_array_equal(ids, [[5, 6, 7], [8, 0, 0]])
    np.testing.assert_array_equal(mask, [[1, 1, 1], [1, 0, 0]])
    assert ids.dtype == mask.dtype == np.int64
    ids, mask = pad_rows([[5]], pad_id=9, width=3)
    np.testing.assert_array_equal(ids, [[5, 9, 9]])
    np.testing.assert_array_equal(mask, [[1, 0, 0]])


def test_a_classification_reads_the_extract_token_and_names_the_labels(tokenizer):
    clf = classifier("classification", tokenizer)
    assert clf.example_rows("Hello")[0][0] == TOKENS.start and clf.example_rows("Hello")[0][-1] == TOKENS.extract
    got = clf.classify("Hello")
    t = TOKENS.extract
    assert got.labels == ("no", "yes", "maybe")
    np.testing.assert_allclose(got.logits, [t / 1000, -t / 1000, (t % 7) / 1000], rtol=1e-6)
    np.testing.assert_allclose(got.probabilities, softmax(np.array(got.logits)))
    assert not got.choices and clf.choice is False and clf.providers == ["CPUExecutionProvider"]


def test_similarity_adds_its_two_rows(tokenizer):
    clf = classifier("similarity", tokenizer)
    got = clf.classify(("a cat", "a dog"))
    t = TOKENS.extract
    np.testing.assert_allclose(got.logits, [2 * t / 1000, -2 * t / 1000, 2 * (t % 7) / 1000], rtol=1e-6)
    assert clf.session.runs == [(2, max(len(r) for r in clf.example_rows(("a cat", "a dog"))))]


def test_rows_run_in_batches_of_the_size_asked_and_give_the_same_results(tokenizer):
    texts = [f"text number {i}" + " more" * i for i in range(5)]
    results = {}
    for batch in (1, 2, 32):
        clf = classifier("classification", tokenizer)
        results[batch] = clf.classify_batch(texts, batch_size=batch)
        assert [r[0] for r in clf.session.runs] == {1: [1] * 5, 2: [2, 2, 1], 32: [5]}[batch]
    assert results[1] == results[2] == results[32]


def test_each_row_is_read_at_its_own_last_token_whatever_its_padding(tokenizer):
    clf = classifier("classification", tokenizer, transformation=dataclasses.replace(
        transformation("classification"), sequences=(("start", "text"),)), special_tokens=SpecialTokens(start=1))
    out = clf.classify_batch(["a", "b c d e f g"])
    last = [clf.example_rows(t)[0][-1] for t in ("a", "b c d e f g")]
    assert [round(r.logits[0] * 1000) for r in out] == last


def test_multiple_choice_groups_examples_by_their_number_of_choices(tokenizer):
    clf = classifier("multiple-choice", tokenizer)
    examples = [("ctx", ["a", "b", "c"]), ("ctx", ["a", "b"]), ("ctx", ["x", "y", "z"]), ("ctx", ["only"])]
    out = clf.classify_batch(examples, batch_size=6)
    assert [r.labels for r in out] == [("a", "b", "c"), ("a", "b"), ("x", "y", "z"), ("only",)]
    assert all(r.choices for r in out) and clf.choice
    assert [s[:2] for s in clf.session.runs] == [(2, 3), (1, 2), (1, 1)]  # 6 rows a run: 2 of 3 choices
    t = TOKENS.extract
    np.testing.assert_allclose(out[0].logits, [t / 1000] * 3, rtol=1e-6)
    np.testing.assert_allclose(out[0].probabilities, [1 / 3] * 3)
    clf = classifier("multiple-choice", tokenizer)
    clf.classify_batch(examples[:1] * 2, batch_size=2)  # fewer rows than one example's: still one a run
    assert [s[:2] for s in clf.session.runs] == [(1, 3), (1, 3)]
    clf = classifier("multiple-choice", tokenizer)
    clf.classify_batch(examples[:1] * 3, batch_size=9)
    assert [s[:2] for s in clf.session.runs] == [(3, 3)]


def test_rows_given_directly_are_labelled_by_the_task(tokenizer):
    clf = classifier("multiple-choice", tokenizer)
    out = clf.classify_rows([[[1, 2], [3, 4]]])
    assert out[0].labels == ("choice 0", "choice 1")
    clf = classifier("classification", tokenizer, id2label={"0": "neg", "1": "pos"})
    assert clf.classify_rows([[[1, 2]]])[0].labels == ("neg", "pos")
    assert clf.classify_rows([]) == []


@pytest.mark.parametrize("examples", ["text", b"bytes", 5, None])
def test_examples_must_be_a_list(tokenizer, examples):
    with pytest.raises(TypeError, match=r"^classify_batch\(\) takes a list of examples, got "):
        classifier("classification", tokenizer).classify_batch(examples)


@pytest.mark.parametrize("batch, ok", [(1, True), (0, False), (-1, False), (True, False), (2.0, False)])
def test_batch_size_is_an_integer_of_at_least_one(tokenizer, batch, ok):
    clf = classifier("classification", tokenizer)
    if ok:
        assert len(clf.classify_batch(["a"], batch_size=batch)) == 1
    else:
        with pytest.raises(InvalidArgumentError, match=rf"^batch_size must be an integer >= 1, got {batch!r}$"):
            clf.classify_batch(["a"], batch_size=batch)


def test_no_tokenizer_is_one_line(tokenizer):
    clf = classifier("classification", None)
    with pytest.raises(ModelDirError, match=r"no tokenizer.json \(needed to turn text into tokens\)$"):
        clf.classify("a")


def test_calibration_feeds_end_with_the_extract_token():
    ids = np.arange(6, dtype=np.int64).reshape(1, 6)
    task = Task("classification", HEAD_SEQUENCE, transformation("classification"), TOKENS)
    feeds = HeadFeeds(task).calibration_feeds(ids, None)
    np.testing.assert_array_equal(feeds["input_ids"], [[0, 1, 2, 3, 4, TOKENS.extract]])
    np.testing.assert_array_equal(feeds["attention_mask"], np.ones((1, 6)))
    assert ids[0, -1] == 5  # the caller's window is not changed
    plain = dataclasses.replace(task, special_tokens=SpecialTokens())
    np.testing.assert_array_equal(HeadFeeds(plain).calibration_feeds(ids, None)["input_ids"], ids)
    choice = Task("multiple-choice", HEAD_CHOICE, transformation("multiple-choice"), TOKENS)
    feeds = HeadFeeds(choice).calibration_feeds(ids, None)
    assert feeds["input_ids"].shape == feeds["attention_mask"].shape == (1, 1, 6)


def head_manifest(name="classification", **change) -> Manifest:
    head = HEAD_CHOICE if name == "multiple-choice" else HEAD_SEQUENCE
    task = Task(name, head, transformation(name), TOKENS, id2label={"0": "no", "1": "yes"})
    return Manifest(SHAPE, task=dataclasses.replace(task, **change), **IO)


def test_a_head_graph_as_its_manifest_says_passes(tmp_path):
    check_head_graph(Session(out_shape=(1, 2)), head_manifest(), tmp_path / "model.onnx")
    check_head_graph(Session(out_shape=(1, 1)), head_manifest("multiple-choice"), tmp_path / "model.onnx")


def test_io_names_other_than_the_manifests(tmp_path):
    m = dataclasses.replace(head_manifest(), inputs=("input_ids",))
    with pytest.raises(ModelDirError) as caught:
        check_head_graph(Session(out_shape=(1, 2)), m, tmp_path / "model.onnx")
    assert str(caught.value) == (f"{tmp_path / 'model.onnx'}: graph does not match gptedge.json: its inputs are "
                                 "['attention_mask', 'input_ids'], the manifest says ['input_ids']")
    m = dataclasses.replace(head_manifest(), outputs=("scores",))
    with pytest.raises(ModelDirError, match=r"its outputs are \['logits'\], the manifest says \['scores'\]$"):
        check_head_graph(Session(out_shape=(1, 2)), m, tmp_path / "model.onnx")


@pytest.mark.parametrize("change, line", [
    (dict(transformation=dataclasses.replace(transformation("classification"), combine="max")),
     "gptedge.json's task combines rows as 'max', not one of one, sum, choices"),
    (dict(transformation=dataclasses.replace(transformation("classification"), sequences=(("start", "txt",
                                                                                             "extract"),))),
     "gptedge.json's task template names 'txt', neither a field (text) nor a special token"),
    (dict(special_tokens=SpecialTokens(start=1)),
     "gptedge.json's task uses the extract token but records no id for it"),
    (dict(special_tokens=SpecialTokens(start=-1, extract=2)),
     "gptedge.json says the start token is -1, outside the model's vocabulary (0..50256)"),
    (dict(special_tokens=SpecialTokens(start=1, extract=50257)),
     "gptedge.json says the extract token is 50257, outside the model's vocabulary (0..50256)"),
])
def test_a_task_the_runtime_cannot_feed_is_one_line(tmp_path, change, line):
    with pytest.raises(ModelDirError) as caught:
        check_head_graph(Session(out_shape=(1, 2)), head_manifest(**change), tmp_path / "model.onnx")
    assert str(caught.value) == f"{tmp_path}: {line}"


def test_special_ids_at_the_vocabularys_edges_pass(tmp_path):
    m = head_manifest(special_tokens=SpecialTokens(start=0, extract=50256))
    check_head_graph(Session(out_shape=(1, 2)), m, tmp_path / "model.onnx")


def test_the_probe_run_must_give_the_tasks_shape(tmp_path):
    graph = tmp_path / "model.onnx"
    with pytest.raises(ModelDirError) as caught:
        check_head_graph(Session(out_shape=(1, 3)), head_manifest(), graph)
    assert str(caught.value) == f"{graph}: gptedge.json says task classification with 2 outputs, the graph gives [1, 3]"
    with pytest.raises(ModelDirError, match=r"task multiple-choice with 1 outputs, the graph gives \[1, 2\]$"):
        check_head_graph(Session(out_shape=(1, 2)), head_manifest("multiple-choice"), graph)
    probe = Session(out_shape=(1, 2))
    check_head_graph(probe, head_manifest(), graph)
    assert probe.runs == [(1, 2)]
    probe = Session(out_shape=(1, 1))
    check_head_graph(probe, head_manifest("multiple-choice"), graph)
    assert probe.runs == [(1, 1, 2)]


def test_a_graph_that_does_not_run_is_one_line(tmp_path):
    graph = tmp_path / "model.onnx"
    with pytest.raises(ModelDirError) as caught:
        check_head_graph(Session(fails="[ONNXRuntimeError] : 2 : bad shape\nmore detail" + "x" * 300), head_manifest(),
                         graph)
    assert str(caught.value) == f"{graph}: the graph does not run ([ONNXRuntimeError] : 2 : bad shape)"
    with pytest.raises(ModelDirError) as caught:
        check_head_graph(Session(fails="y" * 300), head_manifest(), graph)
    assert str(caught.value) == f"{graph}: the graph does not run ({'y' * 160})"


def test_load_classifier_refuses_what_is_not_a_classifier_dir(tmp_path, gpt2_model_dir):
    with pytest.raises(TypeError, match=r"^load_classifier\(\) takes a model directory path, got int$"):
        cl.load_classifier(5)
    with pytest.raises(ModelDirError, match=r"absent: no such model directory$"):
        cl.load_classifier(tmp_path / "absent")
    with pytest.raises(ModelDirError) as caught:
        cl.load_classifier(str(gpt2_model_dir))
    assert str(caught.value) == (f"{gpt2_model_dir} is a language model, not a classifier (its gptedge.json names no "
                                 "task): use gptedge generate / gptedge.runtime.load")


def test_the_default_batch_is_32_rows(tokenizer):
    clf = classifier("classification", tokenizer)
    clf.classify_batch(["a"] * 33)
    assert [s[0] for s in clf.session.runs] == [32, 1]
    clf = classifier("classification", tokenizer)
    clf.classify_rows([[[1, 2]]] * 32)
    assert [s[0] for s in clf.session.runs] == [32]


def test_load_classifier_checks_the_dir_as_gptedge_wrote_it(tmp_path, monkeypatch):
    """Not as an imported dir (whose claims are mostly skipped): every claim, file record and hash is checked."""
    import json

    m = head_manifest()
    (tmp_path / "gptedge.json").write_text(json.dumps(m.to_dict()))
    asked = {}

    def opened(model_dir, manifest, imported, device, session):
        asked.update(model_dir=model_dir, imported=imported, device=device, session=session)
        return Session(out_shape=(1, 2)), model_dir / "model.onnx", "tok"

    monkeypatch.setattr(cl, "open_checked_session", opened)
    clf = cl.load_classifier(tmp_path, device="cpu")
    assert asked == {"model_dir": tmp_path, "imported": False, "device": "cpu", "session": None}
    assert clf.task == m.task and clf.tokenizer == "tok" and clf.device == "cpu" and clf.output == "logits"
    assert clf.load_s >= 0


def test_an_unknown_template_part_names_every_field(tmp_path):
    line = transformation("entailment")
    m = head_manifest("entailment", transformation=dataclasses.replace(
        line, sequences=(("start", "premise", "delimiter", "hyp", "extract"),)), special_tokens=TOKENS)
    with pytest.raises(ModelDirError) as caught:
        check_head_graph(Session(out_shape=(1, 2)), m, tmp_path / "model.onnx")
    assert str(caught.value) == (f"{tmp_path}: gptedge.json's task template names 'hyp', neither a field (premise, "
                                 "hypothesis) nor a special token")
