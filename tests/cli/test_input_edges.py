"""Inputs read as their format says, and options that would do nothing refused: JSON Lines split at
"\\n" only (a string may hold U+2028, U+2029 or U+0085), errors naming their line; pack's --platform with
--target web and --no-page with --target mobile are usage errors (exit 2), before any work."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from gptedge.cli import main
from gptedge.runtime.errors import InvalidArgumentError
from gptedge.runtime.modeldir.tasks import read_jsonl


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\u0085"])
def test_jsonl_lines_end_at_newline_only(separator):
    text = json.dumps({"text": f"one{separator}line"},
                      ensure_ascii=False) + "\n\n" + json.dumps({"text": "two"}) + "\r\n"
    assert read_jsonl(text) == [{"text": f"one{separator}line"}, {"text": "two"}]


def test_jsonl_errors_name_their_line():
    text = '{"text": "a\u2028b"}\n\n{"text": }\n'
    with pytest.raises(InvalidArgumentError, match=r"^JSONL line 3: not JSON"):
        read_jsonl(text)
    with pytest.raises(InvalidArgumentError, match=r"^x.jsonl line 2: not a JSON object$"):
        read_jsonl('{"text": "a"}\n[1]\n', "x.jsonl")


def test_labelled_compare_numbers_lines_as_read_jsonl_does():
    from gptedge.measure.classify_compare import read_labelled
    from gptedge.runtime.modeldir.tasks import Task, transformation

    task = Task("classification", "sequence-classification", transformation("classification"),
                id2label={"0": "no", "1": "yes"})
    text = '{"text": "a\u2028b", "label": "no"}\n{"text": "c", "label": "maybe"}\n'
    with pytest.raises(InvalidArgumentError, match=r"line 2"):
        read_labelled(task, text)


@pytest.mark.parametrize("args, says", [
    (["--target", "web", "--platform", "arm"], "--platform applies to --target mobile"),
    (["--target", "web", "--platform", "amd64", "--no-page"], "--platform applies to --target mobile"),
    (["--target", "mobile", "--no-page"], "--page / --no-page apply to --target web"),
    (["--target", "mobile", "--page"], "--page / --no-page apply to --target web"),
])
def test_pack_options_that_do_nothing_for_the_target_are_refused(tmp_path, args, says):
    result = CliRunner().invoke(main, ["pack", str(tmp_path), *args, "-o", str(tmp_path / "out")])
    assert result.exit_code == 2 and says in result.output, result.output
    assert not (tmp_path / "out").exists()
