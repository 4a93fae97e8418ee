"""`compare --labelled` on plain data: the labelled lines read at each edge (a label index 0 and n - 1 taken, -1 and
n refused, booleans refused, the line named), the dirs it refuses to put in one table, the figures compare_classifiers
computes from fake classifiers' logits (accuracy, agreement, KL, confusion), and the printed table as a user reads it
(75.00 %, not 0.75 %). No model (test_classify_compare.py runs real classifier dirs)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from gptedge.cli.compare_labelled import compact_report, markdown_report
from gptedge.measure import classify_compare as cc
from gptedge.measure.classify_compare import ClassifierRow, check_classifier_dirs, compare_classifiers, read_labelled
from gptedge.runtime.errors import InvalidArgumentError
from gptedge.runtime.modeldir.manifest import Manifest, ModelShape, Quantization
from gptedge.runtime.modeldir.tasks import HEAD_CHOICE, HEAD_SEQUENCE, Task, transformation

LABELS = ["contradiction", "neutral", "entailment"]
ENTAILMENT = Task("entailment", HEAD_SEQUENCE, transformation("entailment"), id2label=dict(enumerate(LABELS)))
ENTAILMENT = dataclasses.replace(ENTAILMENT, id2label={str(k): v for k, v in ENTAILMENT.id2label.items()})
CHOICE = Task("multiple-choice", HEAD_CHOICE, transformation("multiple-choice"))
SHAPE = ModelShape("gpt2", 2, 4, 8, 100, 64)


def _lines(*objs) -> str:
    return "\n".join(o if isinstance(o, str) else json.dumps(o) for o in objs) + "\n"


def test_labelled_lines_and_their_gold_indices():
    text = _lines({"premise": "a", "hypothesis": "b", "label": "entailment"}, "",
                  {"premise": "c", "hypothesis": "d", "label": "contradiction"})
    got = read_labelled(ENTAILMENT, text)
    assert got.gold == [2, 0] and got.examples == [{"premise": "a", "hypothesis": "b"},
                                                  {"premise": "c", "hypothesis": "d"}]


@pytest.mark.parametrize("label, ok", [(0, True), (2, True), (-1, False), (3, False), (True, False), ("1", False),
                                       (1.0, False)])
def test_a_choice_index_at_each_edge(label, ok):
    text = _lines({"context": "x", "choices": ["p", "q", "r"], "label": 0},
                  {"context": "y", "choices": ["p", "q", "r"], "label": label})
    if ok:
        assert read_labelled(CHOICE, text).gold == [0, label]
    else:
        with pytest.raises(InvalidArgumentError, match=rf"^JSONL line 2: label {label!r} is not a choice index "
                                                       r"\(0\.\.2\)$"):
            read_labelled(CHOICE, text)


def test_bad_lines_are_named_by_their_number():
    good = {"premise": "a", "hypothesis": "b", "label": "neutral"}
    with pytest.raises(InvalidArgumentError, match=r"^f.jsonl line 3: label 'maybe' is not one of the model's labels "
                                                   r"\['contradiction', 'neutral', 'entailment'\]$"):
        read_labelled(ENTAILMENT, _lines(good, "", {**good, "label": "maybe"}), "f.jsonl")
    with pytest.raises(InvalidArgumentError, match=r"^JSONL line 2: no 'label' \(the gold label, one of "):
        read_labelled(ENTAILMENT, _lines(good, {"premise": "a", "hypothesis": "b"}))
    with pytest.raises(InvalidArgumentError, match=r"^JSONL line 1: no 'label' \(the gold choice's index\)$"):
        read_labelled(CHOICE, _lines({"context": "x", "choices": ["p", "q"]}))
    with pytest.raises(InvalidArgumentError, match=r"^JSONL line 2: "):
        read_labelled(ENTAILMENT, _lines(good, {"premise": "a", "label": "neutral"}))  # a field missing
    with pytest.raises(InvalidArgumentError, match=r"label 1 is not one of"):
        read_labelled(ENTAILMENT, _lines({**good, "label": 1}))


def _manifest(task, **kw) -> Manifest:
    return Manifest(SHAPE, task=task, **kw)


def test_dirs_that_cannot_share_a_table_are_refused():
    assert check_classifier_dirs([("a", _manifest(ENTAILMENT)), ("b", _manifest(ENTAILMENT))]) is ENTAILMENT
    with pytest.raises(InvalidArgumentError, match=r"^lm is a language model and a a classifier: compare takes "
                                                   r"language-model dirs \(--text\) or classifier dirs \(--labelled\), "
                                                   r"not both$"):
        check_classifier_dirs([("a", _manifest(ENTAILMENT)), ("lm", _manifest(None))])
    with pytest.raises(InvalidArgumentError, match=r"^b is a classifier for task multiple-choice, the reference a for "
                                                   r"entailment: only dirs of one task can be compared$"):
        check_classifier_dirs([("a", _manifest(ENTAILMENT)), ("b", _manifest(CHOICE))])
    other = dataclasses.replace(ENTAILMENT, id2label={"0": "no", "1": "maybe", "2": "yes"})
    with pytest.raises(InvalidArgumentError, match=r"^b has the labels \['no', 'maybe', 'yes'\], the reference a "
                                                   r"\['contradiction', 'neutral', 'entailment'\]: only dirs with one "
                                                   r"label set can be compared$"):
        check_classifier_dirs([("a", _manifest(ENTAILMENT)), ("b", _manifest(other))])


class FakeClassifier:
    """Logits given per example: classify_rows returns them, in the order asked."""

    def __init__(self, name, logits, task=ENTAILMENT, quantization=None):
        self.model_dir = Path(name)
        self.manifest = _manifest(task, quantization=quantization)
        self.task, self.choice = task, task.head == HEAD_CHOICE
        self.logits = {i: np.asarray(x, np.float32) for i, x in enumerate(logits)}
        self.runs = []

    def example_rows(self, example):
        return [[example["id"]]] * (len(example["choices"]) if self.choice else 1)  # a row a choice

    def classify_rows(self, rows, per_run):
        self.runs.append((len(rows), per_run))
        return [SimpleNamespace(logits=self.logits[r[0][0]], index=int(np.argmax(self.logits[r[0][0]])))
                for r in rows]


def test_the_figures_from_the_logits(monkeypatch):
    monkeypatch.setattr(cc, "graph_size", lambda d, m: 1_234_567)
    ref_logits = [[3, 0, 0], [0, 3, 0], [0, 0, 3], [0, 0, 3]]  # argmax 0 1 2 2
    other_logits = [[3, 0, 0], [0, 3, 0], [0, 0, 3], [3, 0, 0]]  # the last differs
    gold = [0, 1, 1, 2]
    labelled = cc.LabelledSet([{"id": i} for i in range(4)], gold)
    ref, other = FakeClassifier("ref", ref_logits), FakeClassifier("q", other_logits,
                                                                   quantization=Quantization(method="dynamic"))
    seen = []
    rows = compare_classifiers([ref, other], labelled, repeats=2, progress=lambda i, n: seen.append((i, n)))
    assert seen == [(1, 2), (2, 2)]
    assert [(r.accuracy, r.agreement) for r in rows] == [(0.75, 1.0), (0.5, 0.75)]
    assert rows[0].kl == 0.0
    p = np.exp(ref_logits[3]) / np.exp(ref_logits[3]).sum()
    q = np.exp(other_logits[3]) / np.exp(other_logits[3]).sum()
    assert rows[1].kl == pytest.approx(float((p * np.log(p / q)).sum()) / 4, rel=1e-9)
    assert rows[0].confusion == [[1, 0, 0], [0, 1, 1], [0, 0, 1]] and rows[1].confusion == [[1, 0, 0], [0, 1, 1],
                                                                                              [1, 0, 0]]
    assert (rows[0].method, rows[1].method, rows[0].size_bytes, rows[0].examples) == ("fp32", "dynamic", 1_234_567, 4)
    assert rows[0].labels == LABELS and rows[1].task == "entailment" and rows[1].model == "q"
    # every example once at 32 rows a run (entailment: one row an example), then per batch 1 warm-up + 2 timed
    assert ref.runs == [(4, 32), (1, 1), (4, 1), (4, 1), (4, 32), (4, 32), (4, 32)]
    for bad in (0, -1, True, 1.5):
        with pytest.raises(InvalidArgumentError, match=rf"^repeats must be an integer >= 1, got {bad!r}$"):
            compare_classifiers([ref], labelled, repeats=bad)


def test_choices_are_columns_as_wide_as_the_most_choices(monkeypatch):
    monkeypatch.setattr(cc, "graph_size", lambda d, m: 0)
    labelled = cc.LabelledSet([{"id": 0, "choices": ["a", "b"]}, {"id": 1, "choices": ["a", "b", "c"]}], [1, 2])
    clf = FakeClassifier("mc", [[0, 1], [0, 0, 1]], task=CHOICE)
    (row,) = compare_classifiers([clf], labelled, repeats=1)
    assert row.labels == ["choice 0", "choice 1", "choice 2"] and row.accuracy == 1.0
    assert row.confusion == [[0, 0, 0], [0, 1, 0], [0, 0, 1]]
    # multiple choice: B examples a run of at most N choices each, so 3 rows a run at batch 1 and 96 at 32
    assert clf.runs == [(2, 32), (1, 3), (2, 3), (2, 96), (2, 96)]


def test_speed_is_examples_over_the_median_pass(monkeypatch):
    monkeypatch.setattr(cc, "graph_size", lambda d, m: 0)
    ticks = iter([0.0, 1.0, 10.0, 13.0, 20.0, 20.5] * 2)  # timed passes of 1 s, 3 s, 0.5 s: median 1 s

    monkeypatch.setattr(cc.time, "perf_counter", lambda: next(ticks))
    labelled = cc.LabelledSet([{"id": i} for i in range(4)], [0, 1, 2, 0])
    clf = FakeClassifier("ref", [[1, 0, 0]] * 4)
    (row,) = compare_classifiers([clf], labelled, repeats=3)
    assert (row.examples_per_s_batch1, row.examples_per_s_batch32) == (4.0, 4.0)
    ticks = iter([5.0, 5.0] * 6)  # a pass that takes no measurable time: a huge figure, never a division by 0
    rows = compare_classifiers([clf], labelled, repeats=3)
    assert rows[0].examples_per_s_batch1 == pytest.approx(4e9)


ROW = ClassifierRow(model="/x/fp32", task="entailment", precision="fp32", method="fp32", size_bytes=2_500_000,
                    examples=1200, accuracy=0.75, agreement=0.125, kl=0.00123456, examples_per_s_batch1=12.34,
                    examples_per_s_batch32=456.78, labels=["no", "yes"], confusion=[[5, 1], [0, 6]])


def test_the_printed_table_as_a_user_reads_it():
    other = dataclasses.replace(ROW, model="/x/q8-long-name", method="dynamic", accuracy=1.0, agreement=0.0, kl=0.5)
    text = compact_report([ROW, other], "set.jsonl", 3)
    assert text.splitlines()[0] == ("Compared on set.jsonl (1,200 labelled examples, task entailment); reference: fp32 "
                                    "(agreement and KL are against it)")
    assert "| fp32 | fp32 | 2.50 | 75.00 % | 12.50 % | 0.00123 | 12.3 | 456.8 |" in text.splitlines()
    assert "| q8-long-name | dynamic | 2.50 | 100.00 % | 0.00 % | 0.5 | 12.3 | 456.8 |" in text.splitlines()
    assert text.endswith("confusion (rows gold, columns predicted: no, yes):\n  fp32          [5 1] [0 6]\n"
                         "  q8-long-name  [5 1] [0 6]\n")
    assert "the median of 3 timed passes" in text
    md = markdown_report([ROW], "set.jsonl", 1)
    assert md.endswith("Confusion, fp32 (rows gold, columns predicted):\n\n| gold \\ predicted | no | yes |\n"
                       "|---|---:|---:|\n| no | 5 | 1 |\n| yes | 0 | 6 |\n")
