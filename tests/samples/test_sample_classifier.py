"""The shipped sample classifier (samples/sample-classifier): it exports with --task classification through the
CLI, `gptedge classify` names the novel of held-out passages, and the held-out accuracy its README and
training_log.json record is what the exported dir measures on the shipped labelled set."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from gptedge import runtime
from gptedge.cli import main
from gptedge.runtime.modeldir.tasks import read_jsonl

from ..support.checkpoints import ROOT

pytestmark = pytest.mark.slow  # the sample classifier exported and run through the real command

pytest.importorskip("torch")

SAMPLE = ROOT / "samples" / "sample-classifier"
HELD_OUT = ROOT / "samples" / "eval" / "austen-novel.jsonl"
LABELS = ["emma", "mansfield-park", "northanger-abbey", "pride-and-prejudice", "sense-and-sensibility"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("sample-classifier") / "cls"
    result = CliRunner().invoke(main, ["export", str(SAMPLE), "-o", str(out), "--task", "classification"])
    assert result.exit_code == 0, result.output
    return out


def test_ships_under_30_mb_with_its_labels_and_special_tokens():
    assert sum(p.stat().st_size for p in SAMPLE.iterdir()) < 30e6
    config = json.loads((SAMPLE / "config.json").read_text())
    assert config["architectures"] == ["GPT2ForSequenceClassification"] and config["num_labels"] == len(LABELS)
    assert [config["id2label"][str(i)] for i in range(len(LABELS))] == LABELS
    declared = json.loads((SAMPLE / "tokenizer_config.json").read_text())
    assert (declared["bos_token"], declared["cls_token"]) == ("<|endoftext|>", "<|extract|>")


def test_export_passes_the_parity_ladder_and_keeps_the_task(exported):
    manifest = runtime.read_manifest(exported)
    assert manifest.task.name == "classification" and manifest.task.labels() == LABELS
    assert manifest.task.special_tokens.start == 0 and manifest.task.special_tokens.extract == 8192  # added id
    assert manifest.parity.graph_vs_reference.max_abs_diff <= 1e-4


def test_classify_names_the_novel_of_held_out_passages(exported):
    """Two held-out passages of each novel whose label the classifier is sure of (all five are then right)."""
    examples = read_jsonl(HELD_OUT.read_text(encoding="utf-8"))
    clf = runtime.load_classifier(exported, device="cpu")
    results = clf.classify_batch([e["text"] for e in examples])
    for label in LABELS:
        sure = [(r.probabilities[r.index], e) for r, e in zip(results, examples, strict=True)
                if r.label == label and max(r.probabilities) > 0.9]
        picked = [e for _, e in sorted(sure, key=lambda pe: -pe[0])[:2]]
        assert picked and all(e["label"] == label for e in picked), label
        jsonl = exported.parent / f"{label}.jsonl"
        jsonl.write_text("".join(json.dumps(e) + "\n" for e in picked))
        out = CliRunner().invoke(main, ["classify", str(exported), "--jsonl", str(jsonl), "--device", "cpu"])
        assert out.exit_code == 0, out.output
        assert [line.split("\t")[0] for line in out.stdout.splitlines()] == [label, label]


def test_recorded_held_out_accuracy_is_what_the_export_measures(exported):
    examples = read_jsonl(HELD_OUT.read_text(encoding="utf-8"))
    assert len(examples) >= 300 and {e["label"] for e in examples} == set(LABELS)
    results = runtime.load_classifier(exported, device="cpu").classify_batch([e["text"] for e in examples])
    accuracy = sum(r.label == e["label"] for r, e in zip(results, examples, strict=True)) / len(examples)
    log = json.loads((SAMPLE / "training_log.json").read_text())
    assert log["log"][-1]["held_out_accuracy"] == pytest.approx(accuracy, abs=1e-4)
    readme = (SAMPLE / "README.md").read_text()
    assert re.search(rf"\| fp32 \|[^\n]*\| {accuracy:.2%} ", readme), "README's fp32 row"
    assert accuracy > 0.5  # five labels: chance is 0.2


def test_transformers_reads_the_checkpoint_and_agrees_with_the_export(exported):
    """The shipped checkpoint is a real GPT2ForSequenceClassification: transformers loads every tensor (no missing or
    unexpected keys) and its logits on held-out rows match the exported graph's."""
    transformers = pytest.importorskip("transformers")
    import numpy as np
    import torch

    model, info = transformers.GPT2ForSequenceClassification.from_pretrained(SAMPLE, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    clf = runtime.load_classifier(exported, device="cpu")
    texts = [e["text"] for e in read_jsonl(HELD_OUT.read_text(encoding="utf-8"))[::100]]  # one of each novel
    for text in texts:
        [row] = clf.example_rows(text)  # start text extract
        with torch.no_grad():
            want = model.eval()(torch.tensor([row])).logits.numpy()
        got = clf.logits(np.array([row]), np.ones((1, len(row)), np.int64))
        assert np.abs(want - got).max() < 1e-4


@pytest.mark.parametrize("out, eval_out, says", [
    ("samples/sample-model", "{tmp}/e.jsonl", "--out samples/sample-model overlaps the input"),
    ("samples", "{tmp}/e.jsonl", "--out samples overlaps the input"),
    ("{tmp}/ck", "samples/sample-model/e.jsonl", "overlaps the input"),
    ("{tmp}/existing", "{tmp}/e.jsonl", "exists (--force replaces it)"),
])
def test_the_training_script_refuses_outputs_that_would_lose_data(tmp_path, out, eval_out, says):
    """Checked before minutes of training: the script never replaces its inputs, nor an existing output unless
    --force."""
    import subprocess
    import sys

    (tmp_path / "existing").mkdir()
    (tmp_path / "corpus").mkdir()
    args = ["--corpus", str(tmp_path / "corpus"), "--out", out.format(tmp=tmp_path), "--eval-out",
            eval_out.format(tmp=tmp_path)]
    before = sorted(p.name for p in (ROOT / "samples" / "sample-model").iterdir())
    result = subprocess.run([sys.executable, str(ROOT / "samples" / "train_sample_classifier.py"), *args],
                            capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 2 and says in result.stderr, result.stderr
    assert sorted(p.name for p in (ROOT / "samples" / "sample-model").iterdir()) == before
