"""`gptedge classify` and `gptedge export --task`: what they print is what the Python API returns, every option
acts, and every bad invocation is one line."""

from __future__ import annotations

import json

import pytest

from gptedge import runtime
from gptedge.cli import main
from gptedge.runtime.classify import Classifier

from ..support.cli import one_line_error

pytest.importorskip("transformers")

pytestmark = pytest.mark.interop


def run_json(runner, *args) -> list[dict]:
    result = runner.invoke(main, ["classify", *map(str, args), "--json", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_text_pair_choices_and_jsonl_print_what_the_api_returns(runner, task_dirs, tmp_path):
    api = runtime.load_classifier(task_dirs["openai-seq"], device="cpu")
    [got] = run_json(runner, task_dirs["openai-seq"], "It was a truth universally acknowledged.")
    want = api.classify("It was a truth universally acknowledged.")
    assert got["label"] == want.label and got["logits"] == pytest.approx(want.logits, abs=1e-6)
    assert got["probabilities"] == pytest.approx(dict(zip(want.labels, want.probabilities, strict=True)), abs=1e-9)

    entail = runtime.load_classifier(task_dirs["gpt2-seq"], device="cpu")
    [got] = run_json(runner, task_dirs["gpt2-seq"], "--pair", "A man sleeps.", "Nobody is awake.")
    assert got["logits"] == pytest.approx(entail.classify(("A man sleeps.", "Nobody is awake.")).logits, abs=1e-6)

    mc = runtime.load_classifier(task_dirs["gpt2-mc"], device="cpu")
    [got] = run_json(runner, task_dirs["gpt2-mc"], "The sky is", "--choice", "blue", "--choice", "a carrot")
    want = mc.classify(("The sky is", ["blue", "a carrot"]))
    assert got["labels"] == ["blue", "a carrot"] and got["logits"] == pytest.approx(want.logits, abs=1e-6)

    lines = [{"premise": "It rains.", "hypothesis": "The street is wet.", "label": "entailment"},
             {"premise": "A cat.", "hypothesis": "A dog."}]
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n", encoding="utf-8")
    got = run_json(runner, task_dirs["gpt2-seq"], "--jsonl", path)
    want = entail.classify_batch([(x["premise"], x["hypothesis"]) for x in lines])
    assert [g["label"] for g in got] == [w.label for w in want]
    assert [g["logits"] for g in got] == [pytest.approx(w.logits, abs=1e-6) for w in want]


def test_plain_output_is_one_line_an_example_best_label_first(runner, task_dirs):
    result = runner.invoke(main, ["classify", str(task_dirs["openai-seq"]), "Hello there", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    want = runtime.load_classifier(task_dirs["openai-seq"], device="cpu").classify("Hello there")
    ranked = sorted(zip(want.labels, want.probabilities, strict=True), key=lambda lp: -lp[1])
    [line] = result.stdout.splitlines()
    assert line == (f"{ranked[0][0]}\t{ranked[0][1]:.4f}\t(" +
                    ", ".join(f"{label} {p:.4f}" for label, p in ranked[1:]) + ")")


def test_batch_size_sets_the_rows_of_each_run(runner, task_dirs, tmp_path, monkeypatch):
    shapes = []
    real = Classifier.logits
    monkeypatch.setattr(Classifier, "logits", lambda self, ids, mask: shapes.append(ids.shape) or real(self, ids, mask))
    path = tmp_path / "s.jsonl"
    path.write_text("\n".join(json.dumps({"a": f"text {i}", "b": "other"}) for i in range(3)), encoding="utf-8")
    for size, runs in ((32, 1), (2, 3)):  # similarity: 2 rows an example, 6 rows
        shapes.clear()
        result = runner.invoke(main, ["classify", str(task_dirs["gpt2-sim"]), "--jsonl", str(path), "--device", "cpu",
                                      "--batch-size", str(size)])
        assert result.exit_code == 0, result.output
        assert len(shapes) == runs
        assert max(s[0] for s in shapes) == min(size, 6)


def test_device_and_threads_reach_the_loader(runner, task_dirs, monkeypatch):
    seen = {}
    real = runtime.load_classifier

    def spy(model, device="auto", session=None):
        seen.update(device=device, threads=session.threads)
        return real(model, device="cpu", session=session)

    monkeypatch.setattr(runtime, "load_classifier", spy)
    result = runner.invoke(main, ["classify", str(task_dirs["openai-seq"]), "x", "--device", "cpu", "--threads", "1"])
    assert result.exit_code == 0, result.output
    assert seen == {"device": "cpu", "threads": 1}


@pytest.mark.parametrize("args, code, message", [
    ([], 2, "give one of TEXT"),
    (["x", "--pair", "a", "b"], 2, "give one of TEXT"),
    (["--choice", "a"], 2, "give one of TEXT"),
    (["only one text"], 2, "similarity takes 2 fields (a, b) as a list or a mapping, got str (on the command line: "
                           "--pair A B"),
])
def test_bad_classify_invocations_are_one_line(runner, task_dirs, args, code, message):
    result = runner.invoke(main, ["classify", str(task_dirs["gpt2-sim"]), *args, "--device", "cpu"])
    assert result.exit_code == code
    assert message in one_line_error(result)


def test_bad_jsonl_lines_are_named(runner, task_dirs, tmp_path):
    path = tmp_path / "bad.jsonl"
    for text, message in (('{"a": "x", "b": "y"}\nnot json\n', "bad.jsonl line 2: not JSON"),
                          ('[1, 2]\n', "bad.jsonl line 1: not a JSON object"),
                          ('{"a": "x"}\n', "similarity: field 'b' must be a string, got None")):
        path.write_text(text, encoding="utf-8")
        result = runner.invoke(main, ["classify", str(task_dirs["gpt2-sim"]), "--jsonl", str(path)])
        assert result.exit_code == 2 and message in one_line_error(result)


def test_classify_on_a_language_model_and_generate_on_a_classifier_are_one_line(runner, task_dirs, gpt2_model_dir):
    result = runner.invoke(main, ["classify", str(gpt2_model_dir), "hi", "--device", "cpu"])
    assert result.exit_code == 1 and "is a language model, not a classifier" in one_line_error(result)
    result = runner.invoke(main, ["generate", str(task_dirs["gpt2-mc"]), "-p", "hi", "--device", "cpu"])
    assert result.exit_code == 1 and "multiple-choice classifier" in one_line_error(result)


def test_export_task_from_the_command_line(runner, task_checkpoints, tmp_path):
    ck = task_checkpoints["openai-mc"]
    result = runner.invoke(main, ["export", str(ck), "-o", str(tmp_path / "mc"), "--task", "multiple-choice"])
    assert result.exit_code == 0, result.output
    assert "(multiple-choice, multiple-choice head): head vs reference max |diff|" in result.output
    assert runtime.load_classifier(tmp_path / "mc", device="cpu").task.name == "multiple-choice"
    # --special-token is used: naming another extract token changes the manifest
    result = runner.invoke(main, ["export", str(ck), "-o", str(tmp_path / "mc2"), "--task", "multiple-choice",
                                  "--special-token", "extract=9", "--special-token", "start=7"])
    assert result.exit_code == 0, result.output
    tokens = runtime.read_manifest(tmp_path / "mc2").task.special_tokens
    assert (tokens.start, tokens.delimiter, tokens.extract) == (7, 50258, 9)


@pytest.mark.parametrize("args, message", [
    (["--task", "entailment"], "task entailment needs a sequence-classification head"),
    (["--task", "multiple-choice", "--special-token", "nope=1"], "special token 'nope' is not one of start"),
    (["--task", "multiple-choice", "--special-token", "extract"], "'extract' is not ROLE=TOKEN"),
    (["--special-token", "extract=1"], "--special-token applies to --task exports only"),
    (["--task", "multiple-choice", "--graph", "kv_buffer"], "--graph and --precision do not apply"),
])
def test_bad_export_task_invocations_are_one_line(runner, task_checkpoints, tmp_path, args, message):
    result = runner.invoke(main, ["export", str(task_checkpoints["gpt2-mc"]), "-o", str(tmp_path / "o"), *args])
    assert message in one_line_error(result)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("overrides, says", [
    (dict(num_labels=1, id2label={0: "score"}, problem_type="regression"), "head is regression"),
    (dict(num_labels=1, id2label={0: "score"}), "head is regression (num_labels 1)"),
    (dict(problem_type="multi_label_classification"), "head is multi_label_classification"),
])
def test_heads_that_are_not_one_softmax_are_refused(runner, tmp_path, overrides, says):
    """A regression score (STS-B's similarity) or independent sigmoids would be read as a softmax: refused."""
    from ..support.task_checkpoints import make_checkpoint

    ck = make_checkpoint("gpt2-seq", tmp_path / "ck", **overrides)
    result = runner.invoke(main, ["export", str(ck), "-o", str(tmp_path / "o"), "--task", "similarity"])
    assert says in one_line_error(result) and "single-label classification" in result.output
    assert not (tmp_path / "o").exists()


def test_multiple_choice_batch_size_counts_rows(task_dirs, monkeypatch):
    """--batch-size / max rows bound the token rows of a run for multiple choice too: 8 rows = 2 four-choice
    examples a run."""
    shapes = []
    real = Classifier.logits
    monkeypatch.setattr(Classifier, "logits", lambda self, ids, mask: shapes.append(ids.shape) or real(self, ids, mask))
    clf = runtime.load_classifier(task_dirs["gpt2-mc"], device="cpu")
    clf.classify_batch([(f"context {i}", ["a", "b", "c", "d"]) for i in range(5)], batch_size=8)
    assert [s[:2] for s in shapes] == [(2, 4), (2, 4), (1, 4)]
    shapes.clear()
    clf.classify_batch([("context", ["a", "b", "c"])], batch_size=1)  # fewer rows than one example: it runs alone
    assert [s[:2] for s in shapes] == [(1, 3)]


def test_json_probabilities_have_one_shape_per_head(runner, task_dirs):
    """A sequence head's probabilities map labels; multiple choice's are a list in choice order, repeated
    answers or not."""
    seq = run_json(runner, task_dirs["gpt2-seq"], "--pair", "A man sleeps.", "Nobody is awake.")[0]
    assert isinstance(seq["probabilities"], dict) and list(seq["probabilities"]) == seq["labels"]
    for choices in (["yes", "no"], ["yes", "yes"]):
        args = [a for c in choices for a in ("--choice", c)]
        mc = run_json(runner, task_dirs["gpt2-mc"], "Is it?", *args)[0]
        assert isinstance(mc["probabilities"], list) and len(mc["probabilities"]) == 2


def test_verify_checks_a_classifier_dir(runner, task_dirs, tmp_path):
    """verify on a classifier dir: files, claims and the head graph pass (exit 0, the parity run reported as not
    repeated); a manifest whose labels disagree with the graph's outputs fails (exit 1)."""
    import shutil

    for name in ("gpt2-seq", "gpt2-mc"):
        result = runner.invoke(main, ["verify", str(task_dirs[name]), "--device", "cpu"])
        assert result.exit_code == 0, result.output
        assert "head: I/O, special ids and output shape as the manifest says" in result.output
    bad = tmp_path / "bad"
    shutil.copytree(task_dirs["gpt2-seq"], bad)
    m = json.loads((bad / "gptedge.json").read_text())
    m["task"]["id2label"]["3"] = "extra"
    (bad / "gptedge.json").write_text(json.dumps(m))
    config = json.loads((bad / "config.json").read_text())  # config.json edited alike: only the graph can tell
    config["id2label"]["3"] = "extra"
    (bad / "config.json").write_text(json.dumps(config))
    result = runner.invoke(main, ["verify", str(bad), "--device", "cpu"])
    assert result.exit_code == 1 and "task entailment with 4 outputs, the graph gives [1, 3]" in result.output


def test_a_classifier_dir_is_not_packed_for_the_web(runner, task_dirs, tmp_path):
    result = runner.invoke(main, ["pack", str(task_dirs["gpt2-seq"]), "--target", "web", "--no-page",
                                  "-o", str(tmp_path / "web")])
    assert "an entailment classifier: web packs hold language models" in one_line_error(result)
    assert not (tmp_path / "web").exists()


@pytest.mark.parametrize("edit, says", [
    (lambda t: t["special_tokens"].update(delimiter=None), "task uses the delimiter token but records no id"),
    (lambda t: t["transformation"].update(combine="max"), "combines rows as 'max'"),
    (lambda t: t["transformation"]["sequences"][0].insert(1, "title"), "task template names 'title'"),
])
def test_a_hand_edited_task_is_refused_at_load_in_one_line(runner, task_dirs, tmp_path, edit, says):
    import shutil

    d = tmp_path / "edited"
    shutil.copytree(task_dirs["gpt2-seq"], d)
    m = json.loads((d / "gptedge.json").read_text())
    edit(m["task"])
    (d / "gptedge.json").write_text(json.dumps(m))
    result = runner.invoke(main, ["classify", str(d), "--pair", "a", "b", "--device", "cpu"])
    assert says in one_line_error(result) and "Traceback" not in result.output
