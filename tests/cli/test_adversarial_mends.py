"""What the adversarial pass (benchmarks/adversarial.py) found and this file pins (issue #35): a JSONL line nested
past Python's recursion limit is one line naming it (was RecursionError, "unexpected"); `gptedge info` shows a
classifier dir's manifest (was refused as "not a language model"). The pass itself, on a small subset:
test_adversarial_smoke below."""

from __future__ import annotations

import json
import sys

import pytest

from gptedge.cli import main
from gptedge.runtime.errors import InvalidArgumentError
from gptedge.runtime.modeldir.tasks import read_jsonl


@pytest.mark.parametrize("opener", ["[", '{"a":'])
def test_a_jsonl_line_nested_past_the_recursion_limit_is_one_line(opener):
    closer = "]" if opener == "[" else "}"
    deep = opener * 100_000 + "1" + closer * 100_000
    with pytest.raises(InvalidArgumentError, match=r"^x.jsonl line 2: JSON nested too deeply to be an example$"):
        read_jsonl('{"text": "a"}\n' + deep + "\n", "x.jsonl")
    shallow = '{"text": ' + "[" * 50 + "1" + "]" * 50 + "}"  # well inside the limit: read as it is
    assert read_jsonl(shallow + "\n")[0]["text"] == json.loads(shallow)["text"]
    assert sys.getrecursionlimit() < 100_000


def test_info_shows_a_classifier_dirs_manifest(runner, task_dirs):
    result = runner.invoke(main, ["info", str(task_dirs["gpt2-seq"]), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["manifest"]["task"]["name"] == "entailment" and shown["genai_ready"] is False
    assert shown["web_ready"] is False and "classifier" in shown["web"]


@pytest.mark.parametrize("role, refused", [("wizard", True), ("User", True), ("", True), ("user", False),
                                           ("developer", False), ("tool", False)])
def test_a_chat_role_openai_does_not_know_is_a_400(role, refused):
    pytest.importorskip("starlette")
    from gptedge.serve.chat_schema import parse_chat_request
    from gptedge.serve.openai_schema import ApiError

    body = {"model": "m", "messages": [{"role": role, "content": "hi"}]}
    if not refused:
        assert parse_chat_request(body, 64).messages[0]["role"] == role
        return
    with pytest.raises(ApiError) as caught:
        parse_chat_request(body, 64)
    assert (caught.value.status, caught.value.param) == (400, "messages")
    assert caught.value.message.startswith("messages[0].role must be one of system, developer, user")


def test_a_chat_template_that_does_not_parse_fails_the_dir_checks(tmp_path):
    pytest.importorskip("jinja2")
    from gptedge.runtime.checks.companion_files import _chat_template

    assert _chat_template(tmp_path) == []  # no template: nothing to check
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert _chat_template(tmp_path) == []
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content ")
    assert _chat_template(tmp_path) == ["chat_template.jinja: the chat template does not parse: unexpected end of "
                                        "template, expected 'end of print statement'."]


def test_a_web_pack_left_by_a_killed_server_is_swept_and_a_live_ones_is_kept(tmp_path):
    """serve --web auto packs the model into gptedge-web-PID-*; SIGKILL skips its cleanup. The next start removes
    the folders of processes that are gone, never a live server's, nor a folder of another shape."""
    import os
    import subprocess

    pytest.importorskip("starlette")
    from gptedge.serve.playground import sweep_stale_web_folders

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    dead, live, other = (tmp_path / f"gptedge-web-{gone}-abc", tmp_path / f"gptedge-web-{os.getpid()}-def",
                         tmp_path / "gptedge-web-xyz")
    for folder in (dead, live, other):
        folder.mkdir()
        (folder / "model.onnx").write_bytes(b"x" * 10)
    assert sweep_stale_web_folders(tmp_path) == [dead]
    assert not dead.exists() and live.is_dir() and other.is_dir()
