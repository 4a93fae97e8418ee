"""`compare --labelled`'s command layer (gptedge/cli/compare_labelled.py) without a model: which dirs count as
classifiers, the options refused for them, and what compare_labelled prints and writes (stdout's table or JSON,
the markdown file's exact bytes) with the measuring functions stood in. tests/measure/test_labelled_compare_units.py
covers the table's figures; test_classify_compare.py runs real classifier dirs."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from types import SimpleNamespace

import click
import pytest

from gptedge.cli import compare_labelled as cl
from gptedge.measure import classify_compare as cc
from gptedge.measure.classify_compare import ClassifierRow
from gptedge.runtime.errors import ModelDirError, OutputExistsError

ROW = ClassifierRow(model="/x/fp32", task="entailment", precision="fp32", method="fp32", size_bytes=2_500_000,
                    examples=4, accuracy=0.75, agreement=1.0, kl=0.0, examples_per_s_batch1=12.34,
                    examples_per_s_batch32=456.78, labels=["no", "yes"], confusion=[[1, 1], [0, 2]])


def manifests(monkeypatch, by_dir: dict) -> None:
    def read(d):
        found = by_dir[d]
        if isinstance(found, Exception):
            raise found
        return SimpleNamespace(task=found)

    monkeypatch.setattr(cl.runtime, "read_manifest", read)


def test_any_classifier_reads_each_manifest_and_skips_unreadable_ones(monkeypatch):
    manifests(monkeypatch, {"lm": None, "cls": "entailment", "bad": ModelDirError("x"), "gone": OSError("y")})
    assert cl.any_classifier(("lm", "cls")) is True
    assert cl.any_classifier(("cls",)) is True
    assert cl.any_classifier(("bad", "gone", "cls")) is True
    assert cl.any_classifier(("lm", "bad", "gone")) is False
    assert cl.any_classifier(()) is False


def test_an_unexpected_error_reading_a_manifest_is_not_swallowed(monkeypatch):
    manifests(monkeypatch, {"odd": ValueError("z")})
    with pytest.raises(ValueError):
        cl.any_classifier(("odd",))


def _context(args: list[str]) -> click.Context:
    params = [click.Option([flag], default=None) for _, flag in cl.LM_ONLY]
    command = click.Command("compare", params=params)
    return command.make_context("compare", args)


def test_no_language_model_option_no_text_passes():
    cl.check_options(_context([]), None)
    cl.check_options(_context([]), "")


def test_text_is_refused_for_classifier_dirs():
    with pytest.raises(click.UsageError) as caught:
        cl.check_options(_context([]), "t.txt")
    assert caught.value.message == "classifier dirs are compared on --labelled FILE.jsonl, not --text"


@pytest.mark.parametrize("name, flag", cl.LM_ONLY)
def test_each_language_model_option_is_refused_by_name(name, flag):
    with pytest.raises(click.UsageError) as caught:
        cl.check_options(_context([flag, "1"]), None)
    assert caught.value.message == f"{flag} applies to language-model dirs only, not to classifier dirs"


def test_several_language_model_options_are_all_named():
    with pytest.raises(click.UsageError) as caught:
        cl.check_options(_context(["--plot", "p.png", "--prompts", "p.txt"]), None)
    assert caught.value.message == "--prompts, --plot applies to language-model dirs only, not to classifier dirs"


def test_the_options_are_the_language_model_ones():
    assert cl.LM_ONLY == (("prompts", "--prompts"), ("new_tokens", "--new-tokens"), ("max_tokens", "--max-tokens"),
                          ("peers", "--peers"), ("source", "--source"), ("plot", "--plot"))


@pytest.fixture()
def stood_in(monkeypatch, tmp_path):
    """compare_labelled's collaborators stood in: what each was given is recorded."""
    seen = {}
    labelled = tmp_path / "set.jsonl"
    labelled.write_text('{"premise": "a", "hypothesis": "b", "label": "yes"}\n', encoding="utf-8")
    monkeypatch.setattr(cl.runtime, "read_manifest", lambda d: f"manifest of {d}")

    def check(pairs):
        seen["checked"] = pairs
        return "the task"

    def read_labelled(task, text, name):
        seen["read"] = (task, text, name)
        return "labelled"

    def load(d, device, session):
        seen.setdefault("loaded", []).append((d, device, session.threads))
        return f"model {d}"

    def compare(loaded, labelled, repeats, progress):
        seen["compared"] = (loaded, labelled, repeats)
        return [ROW, dataclasses.replace(ROW, model="/x/q8", method="dynamic", accuracy=0.5, agreement=0.75, kl=0.25)]

    monkeypatch.setattr(cc, "check_classifier_dirs", check)
    monkeypatch.setattr(cc, "read_labelled", read_labelled)
    monkeypatch.setattr(cc, "compare_classifiers", compare)
    monkeypatch.setattr(cl.runtime, "load_classifier", load)
    return seen, labelled


def test_everything_is_checked_then_each_dir_loaded_and_the_table_printed(stood_in, capsys):
    seen, labelled = stood_in
    cl.compare_labelled(("a", "b"), str(labelled), 3, "cpu", 2, False, None, ())
    assert seen["checked"] == [("a", "manifest of a"), ("b", "manifest of b")]
    assert seen["read"] == ("the task", labelled.read_text(encoding="utf-8"), str(labelled))
    assert seen["loaded"] == [("a", "cpu", 2), ("b", "cpu", 2)]
    assert seen["compared"] == (["model a", "model b"], "labelled", 3)
    out = capsys.readouterr().out
    rows = [ROW, dataclasses.replace(ROW, model="/x/q8", method="dynamic", accuracy=0.5, agreement=0.75, kl=0.25)]
    assert out == cl.compact_report(rows, str(labelled), 3)
    assert "| q8 | dynamic | 2.50 | 50.00 % | 75.00 % | 0.25 | 12.3 | 456.8 |" in out.splitlines()
    assert out.splitlines()[2:4] == ["| model | method | size MB | accuracy | agree with ref | KL(ref‖model) | "
                                     "ex/s batch 1 | ex/s batch 32 |", "|---|---|---:|---:|---:|---:|---:|---:|"]


def test_json_prints_every_row(stood_in, capsys):
    seen, labelled = stood_in
    cl.compare_labelled(("a", "b"), str(labelled), 1, "cpu", 1, True, None, ())
    printed = capsys.readouterr().out
    data = json.loads(printed)
    assert printed == json.dumps(data, indent=2) + "\n"  # indented by 2, as written
    assert [r["model"] for r in data] == ["/x/fp32", "/x/q8"] and data[1]["accuracy"] == 0.5
    assert data[0] == ROW.to_dict()


def test_markdown_is_written_whole_and_said(stood_in, capsys, tmp_path):
    seen, labelled = stood_in
    out = tmp_path / "report" / "cmp.md"
    cl.compare_labelled(("a", "b"), str(labelled), 5, "cpu", 1, False, str(out), (str(labelled),))
    rows = [ROW, dataclasses.replace(ROW, model="/x/q8", method="dynamic", accuracy=0.5, agreement=0.75, kl=0.25)]
    want = cl.markdown_report(rows, str(labelled), 5)
    assert out.read_text(encoding="utf-8") == want
    assert hashlib.sha256(out.read_bytes()).hexdigest() == hashlib.sha256(want.encode()).hexdigest()
    assert "the median of 5 timed passes" in want and "| q8 | dynamic | 2.50 | 50.00 % | 75.00 % |" in want
    assert capsys.readouterr().err.strip().endswith(f"wrote {out}")
    assert sorted(p.name for p in out.parent.iterdir()) == ["cmp.md"]  # no partial file left beside it


def test_markdown_onto_the_labelled_file_is_refused_and_leaves_it_whole(stood_in, capsys):
    seen, labelled = stood_in
    before = labelled.read_bytes()
    with pytest.raises(OutputExistsError, match="is the input"):
        cl.compare_labelled(("a",), str(labelled), 1, "cpu", 1, False, str(labelled), (str(labelled),))
    assert labelled.read_bytes() == before
