"""`gptedge compare --labelled` on classifier dirs: accuracy, agreement and KL with the reference, confusion and size
are what a separate computation from Classifier.classify_batch gives; every bad invocation is one line and writes
nothing."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

from gptedge.cli import main
from gptedge.measure.classify_compare import compare_classifiers, read_labelled
from gptedge.quantize.quantizer import QuantizeRecipe, quantize_model_dir
from gptedge.runtime import load_classifier
from gptedge.runtime.errors import InvalidArgumentError

from ..support.checkpoints import EXCERPT
from ..support.cli import one_line_error

pytest.importorskip("transformers")

pytestmark = pytest.mark.interop

LABELS = ["contradiction", "neutral", "entailment"]  # tests/support/task_checkpoints.LABELS, in index order


def sentences() -> list[str]:
    text = EXCERPT.read_text(encoding="utf-8")
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if 20 < len(s.strip()) < 90]


def pairs(n: int = 24) -> list[dict]:
    """Entailment examples with gold labels cycling through the labels (the model is random: accuracy near 1/3)."""
    s = sentences()
    return [{"premise": s[2 * i], "hypothesis": s[2 * i + 1], "label": LABELS[i % 3]} for i in range(n)]


def choices(n: int = 15) -> list[dict]:
    """Multiple choice with 3 choices, every fifth example 2 (so the confusion is as wide as the most choices)."""
    s = sentences()[100:]
    out = []
    for i in range(n):
        k = 2 if i % 5 == 4 else 3
        out.append({"context": s[4 * i], "choices": s[4 * i + 1:4 * i + 1 + k], "label": i % k})
    return out


def write_jsonl(path, lines: list) -> str:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def dirs(task_dirs, tmp_path_factory) -> dict:
    """The fp32 entailment and multiple-choice dirs, each with one quantized beside it."""
    root = tmp_path_factory.mktemp("cls-compare")
    text = EXCERPT.read_text(encoding="utf-8")
    out = dict(task_dirs)
    for name, recipe in (("gpt2-seq", QuantizeRecipe("dynamic")), ("gpt2-mc", QuantizeRecipe("weight-only", bits=4))):
        out[name + "-q"] = root / (name + "-q")
        quantize_model_dir(task_dirs[name], out[name + "-q"], recipe, calibration_text=text)
    return out


def compare_json(runner, *args) -> list[dict]:
    result = runner.invoke(main, ["compare", *map(str, args), "--device", "cpu", "--repeats", "1", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def expected(model_dirs, lines: list[dict], multiple_choice: bool) -> list[dict]:
    """The figures from each dir's classify_batch probabilities, computed here (not by the code under test)."""
    examples = [{k: v for k, v in x.items() if k != "label"} for x in lines]
    gold = [x["label"] if multiple_choice else LABELS.index(x["label"]) for x in lines]
    size = max(len(x["choices"]) for x in lines) if multiple_choice else len(LABELS)
    probs = [[list(r.probabilities) for r in load_classifier(d, device="cpu").classify_batch(examples)]
             for d in model_dirs]
    ref = probs[0]
    out = []
    for p in probs:
        top = [int(np.argmax(x)) for x in p]
        confusion = [[0] * size for _ in range(size)]
        for g, t in zip(gold, top, strict=True):
            confusion[g][t] += 1
        kl = [sum(a * (np.log(a) - np.log(b)) for a, b in zip(r, x, strict=True)) for r, x in zip(ref, p, strict=True)]
        out.append(dict(accuracy=sum(t == g for t, g in zip(top, gold, strict=True)) / len(gold),
                        agreement=sum(t == int(np.argmax(r)) for t, r in zip(top, ref, strict=True)) / len(gold),
                        kl=sum(kl) / len(kl), confusion=confusion))
    return out


@pytest.mark.parametrize("name, multiple_choice", [("gpt2-seq", False), ("gpt2-mc", True)])
def test_figures_are_what_classify_batch_gives(runner, dirs, tmp_path, name, multiple_choice):
    lines = choices() if multiple_choice else pairs()
    path = write_jsonl(tmp_path / "set.jsonl", lines)
    model_dirs = [dirs[name], dirs[name + "-q"]]
    md = tmp_path / "table.md"
    rows = compare_json(runner, *model_dirs, "--labelled", path, "--markdown", md)
    want = expected(model_dirs, lines, multiple_choice)
    assert [r["model"] for r in rows] == list(map(str, model_dirs))
    for row, w, d in zip(rows, want, model_dirs, strict=True):
        assert row["examples"] == len(lines)
        assert row["accuracy"] == pytest.approx(w["accuracy"], abs=1e-12)
        assert row["agreement"] == pytest.approx(w["agreement"], abs=1e-12)
        assert row["kl"] == pytest.approx(w["kl"], rel=1e-5, abs=1e-12)
        assert row["confusion"] == w["confusion"]
        assert row["size_bytes"] == sum(f.stat().st_size for f in d.glob("model.onnx*"))
        assert row["examples_per_s_batch1"] > 0 and row["examples_per_s_batch32"] > 0
    assert rows[1]["kl"] > 0 and rows[1]["method"] != rows[0]["method"] == "fp32"
    assert rows[0]["labels"] == (["choice 0", "choice 1", "choice 2"] if multiple_choice else LABELS)
    # the markdown file holds every dir's confusion matrix, rows gold, columns predicted
    text = md.read_text(encoding="utf-8")
    for row in rows:
        for label, counts in zip(row["labels"], row["confusion"], strict=True):
            assert f"| {label} | " + " | ".join(map(str, counts)) + " |" in text
    assert text.count("Confusion, ") == 2


def test_a_dir_against_itself_agrees_fully_with_zero_kl(runner, dirs, tmp_path):
    """Similarity (two rows an example, their logits added) against itself."""
    s = sentences()
    lines = [{"a": s[i], "b": s[i + 1], "label": LABELS[i % 3]} for i in range(12)]
    path = write_jsonl(tmp_path / "sim.jsonl", lines)
    rows = compare_json(runner, dirs["gpt2-sim"], dirs["gpt2-sim"], "--labelled", path)
    want = expected([dirs["gpt2-sim"]], lines, False)[0]
    for row in rows:
        assert row["agreement"] == 1.0 and row["kl"] == 0.0
        assert row["accuracy"] == pytest.approx(want["accuracy"]) and row["confusion"] == want["confusion"]


def test_accuracy_follows_the_gold_labels(dirs):
    """Gold set to the model's own predictions: accuracy 1; k of them moved to another label: (E - k) / E."""
    clf = load_classifier(dirs["gpt2-seq"], device="cpu")
    lines = pairs(18)
    predicted = [r.label for r in clf.classify_batch([(x["premise"], x["hypothesis"]) for x in lines])]
    task = clf.task
    for wrong in (0, 5, 18):
        labelled = [{**x, "label": p if i >= wrong else LABELS[(LABELS.index(p) + 1) % 3]}
                    for i, (x, p) in enumerate(zip(lines, predicted, strict=True))]
        text = "".join(json.dumps(x) + "\n" for x in labelled)
        [row] = compare_classifiers([clf], read_labelled(task, text), repeats=1)
        assert row.accuracy == pytest.approx((18 - wrong) / 18)
        assert sum(row.confusion[i][i] for i in range(3)) == 18 - wrong


def test_repeats_sets_the_timed_passes(runner, dirs, tmp_path, monkeypatch):
    """Per dir: one pass for the figures, then per batch size (1 and 32) one warm-up run and --repeats passes."""
    from gptedge.runtime.classify import Classifier

    calls = []
    real = Classifier.classify_rows
    monkeypatch.setattr(Classifier, "classify_rows", lambda self, *a, **k: calls.append(a) or real(self, *a, **k))
    path = write_jsonl(tmp_path / "set.jsonl", pairs(4))
    for repeats in (2, 4):
        calls.clear()
        result = runner.invoke(main, ["compare", str(dirs["gpt2-seq"]), "--labelled", path, "--device", "cpu",
                                      "--repeats", str(repeats)])
        assert result.exit_code == 0, result.output
        assert len(calls) == 1 + 2 * (1 + repeats)
        # batch 1 and 32 (entailment: one row an example): the warm-up runs take the first batch only
        assert [(len(c[0]), c[1]) for c in calls[1:3]] == [(1, 1), (4, 1)]
        assert [(len(c[0]), c[1]) for c in calls[-repeats - 1:-repeats + 1 or None]] == [(4, 32), (4, 32)]


def test_repeats_must_be_at_least_one(dirs):
    clf = load_classifier(dirs["gpt2-seq"], device="cpu")
    labelled = read_labelled(clf.task, json.dumps(pairs(1)[0]))
    with pytest.raises(InvalidArgumentError, match="repeats must be an integer >= 1"):
        compare_classifiers([clf], labelled, repeats=0)


def other_labels(src, dst):
    """A copy of src whose manifest names other labels (read before any load: no hash is checked first)."""
    shutil.copytree(src, dst)
    manifest = json.loads((dst / "gptedge.json").read_text())
    manifest["task"]["id2label"] = {"0": "no", "1": "maybe", "2": "yes"}
    (dst / "gptedge.json").write_text(json.dumps(manifest))
    return dst


@pytest.mark.parametrize("case, code, message", [
    ("language-model", 2, "gpt2-lm is a language model and"),
    ("two-tasks", 2, "openai-seq is a classifier for task classification, the reference"),
    ("label-sets", 2, "has the labels ['no', 'maybe', 'yes'], the reference"),
    ("no-label", 2, "set.jsonl line 2: no 'label' (the gold label, one of ['contradiction'"),
    ("unknown-label", 2, "set.jsonl line 3: label 'yes' is not one of the model's labels"),
    ("choice-out-of-range", 2, "set.jsonl line 1: label 3 is not a choice index (0..2)"),
    ("choice-is-a-name", 2, "set.jsonl line 1: label 'blue' is not a choice index (0..2)"),
    ("missing-field", 2, "set.jsonl line 1: entailment: field 'hypothesis' must be a string"),
    ("text-not-labelled", 2, "classifier dirs are compared on --labelled FILE.jsonl, not --text"),
    ("no-labelled", 2, "classifier dirs are compared on --labelled FILE.jsonl"),
    ("lm-option", 2, "--new-tokens applies to language-model dirs only"),
    ("labelled-on-a-language-model", 2, "--labelled takes classifier dirs (gptedge export --task)"),
    ("repeats-on-a-language-model", 2, "--repeats applies to classifier dirs (--labelled) only"),
    ("missing-dir", 1, "nowhere: no such model directory"),
    ("markdown-onto-the-set", 2, "is the input"),
    ("markdown-into-a-dir", 2, "lies inside the input"),
])
def test_bad_invocations_are_one_line_and_write_nothing(runner, dirs, gpt2_model_dir, tmp_path, case, code, message):
    seq, mc = dirs["gpt2-seq"], dirs["gpt2-mc"]
    good = pairs(3)
    lines = {"no-label": [good[0], {k: v for k, v in good[1].items() if k != "label"}],
             "unknown-label": [*good[:2], {**good[2], "label": "yes"}],
             "choice-out-of-range": [{"context": "c", "choices": ["a", "b", "c"], "label": 3}],
             "choice-is-a-name": [{"context": "c", "choices": ["a", "b", "c"], "label": "blue"}],
             "missing-field": [{"premise": "p", "label": "neutral"}]}.get(case, good)
    labelled = write_jsonl(tmp_path / "set.jsonl", lines)
    lm = tmp_path / "gpt2-lm"
    shutil.copytree(gpt2_model_dir, lm)
    text = tmp_path / "text.txt"
    text.write_text("Some text. " * 40, encoding="utf-8")
    md = tmp_path / "out.md"
    args = {"language-model": [seq, lm, "--labelled", labelled],
            "two-tasks": [seq, dirs["openai-seq"], "--labelled", labelled],
            "label-sets": [seq, other_labels(seq, tmp_path / "relabelled"), "--labelled", labelled],
            "choice-out-of-range": [mc, "--labelled", labelled],
            "choice-is-a-name": [mc, "--labelled", labelled],
            "text-not-labelled": [seq, "--text", text],
            "no-labelled": [seq, dirs["gpt2-seq-q"]],
            "lm-option": [seq, "--labelled", labelled, "--new-tokens", "4"],
            "labelled-on-a-language-model": [lm, "--labelled", labelled],
            "repeats-on-a-language-model": [lm, "--text", text, "--repeats", "2"],
            "missing-dir": [tmp_path / "nowhere", "--labelled", labelled],
            "markdown-onto-the-set": [seq, "--labelled", labelled, "--markdown", labelled],
            "markdown-into-a-dir": [seq, "--labelled", labelled, "--markdown", seq / "table.md"],
            }.get(case, [seq, "--labelled", labelled])
    if "--markdown" not in args:
        args += ["--markdown", md]
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    result = runner.invoke(main, ["compare", *map(str, args), "--device", "cpu"])
    assert result.exit_code == code
    assert message in one_line_error(result)
    assert not md.exists() and not (seq / "table.md").exists()
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before
