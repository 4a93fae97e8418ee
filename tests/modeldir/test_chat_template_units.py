"""The chat-template helpers' edges (runtime/modeldir/chat_template.py) that test_chat_template.py's comparisons with
transformers do not reach: where a template is not found, the special tokens read, the tojson filter and globals,
the whitespace rules, each malformed message's line, and render errors as one ChatTemplateError line."""

from __future__ import annotations

import json
import re
from datetime import datetime

import pytest

from gptedge.runtime.errors import InvalidArgumentError
from gptedge.runtime.modeldir.chat_template import (ChatTemplateError, check_messages, find_chat_template,
                                                    parse_chat_template, render_chat, special_tokens)

pytest.importorskip("jinja2", reason="chat templates render with the serve extra's jinja2")

HELLO = [{"role": "user", "content": "Héllo"}]


def config(d, data) -> None:
    (d / "tokenizer_config.json").write_text(data if isinstance(data, str) else json.dumps(data))


@pytest.mark.parametrize("template", [None, "", "   \n", 5, ["x"], {"a": 1}])
def test_no_usable_template_is_none(tmp_path, template):
    config(tmp_path, {"chat_template": template})
    assert find_chat_template(tmp_path) is None


def test_named_templates_without_a_default_and_odd_entries(tmp_path):
    config(tmp_path, {"chat_template": [{"name": "tool_use", "template": "T"}, "junk", {"template": "U"}]})
    assert find_chat_template(tmp_path) is None
    config(tmp_path, {"chat_template": ["junk", {"name": "default", "template": "D"}]})
    assert find_chat_template(tmp_path) == "D"
    config(tmp_path, ["not", "an", "object"])
    assert find_chat_template(tmp_path) is None and special_tokens(tmp_path) == {}


def test_a_config_that_is_not_json_is_one_line(tmp_path):
    config(tmp_path, "{nope")
    with pytest.raises(ChatTemplateError, match=r"tokenizer_config.json: not JSON \(") as caught:
        find_chat_template(tmp_path)
    assert "\n" not in str(caught.value)
    (tmp_path / "tokenizer_config.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(ChatTemplateError, match="not JSON"):
        special_tokens(tmp_path)


def test_special_tokens_are_the_named_strings_and_added_tokens_contents(tmp_path):
    config(tmp_path, {"bos_token": "<s>", "eos_token": {"content": "</s>", "special": True}, "pad_token": None,
                      "unk_token": {"content": "<unk>"}, "sep_token": 3, "mask_token": "<mask>", "cls_token": "<cls>",
                      "model_max_length": 512, "chat_template": "x", "additional_special_tokens": ["<a>"]})
    assert special_tokens(tmp_path) == {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                                        "mask_token": "<mask>", "cls_token": "<cls>"}
    config(tmp_path, {"pad_token": "<pad>", "sep_token": {"special": True}})  # an AddedToken without content: left out
    assert special_tokens(tmp_path) == {"pad_token": "<pad>"}
    assert special_tokens(tmp_path / "absent") == {}


def test_tojson_keeps_non_ascii_and_takes_its_arguments():
    t = ("{{ messages[0] | tojson }}|{{ messages[0] | tojson(indent=2) }}|"
         "{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}")
    out = render_chat(t, HELLO)
    first, indented, keys = out.split("|")
    assert first == '{"role": "user", "content": "Héllo"}'
    assert indented == json.dumps(HELLO[0], ensure_ascii=False, indent=2)
    assert keys == '{"a": 2, "b": 1}'
    assert render_chat("{{ 'é' | tojson(ensure_ascii=true) }}", HELLO) == '"\\u00e9"'
    assert render_chat("{{ [1, 2] | tojson(separators=[',', ':']) }}", HELLO) == "[1,2]"


def test_blocks_are_trimmed_and_stripped_as_transformers_renders():
    t = "A\n  {% if true %}\nB\n  {% endif %}\nC"
    assert render_chat(t, HELLO) == "A\nB\nC"


def test_globals_extensions_and_variables():
    assert render_chat("{{ strftime_now('%Y') }}", HELLO) == str(datetime.now().year)
    t = "{% for m in [1, 2, 3] %}{% if m == 2 %}{% break %}{% endif %}{{ m }}{% endfor %}"
    assert render_chat(t, HELLO) == "1"
    t = "{% if add_generation_prompt %}G{% endif %}{{ bos_token }}{{ tools }}"
    assert render_chat(t, HELLO, tokens={"bos_token": "<s>"}, tools="T") == "G<s>T"
    assert render_chat(t, HELLO, add_generation_prompt=False, tools="") == ""


def test_raise_exception_names_the_refusal():
    with pytest.raises(ChatTemplateError) as caught:
        render_chat("{{ raise_exception('no system role') }}", HELLO)
    assert str(caught.value) == "the chat template refused the conversation: no system role"


@pytest.mark.parametrize("template, kind", [
    ("{{ messages[0]['content'] + 5 }}", "TypeError"),
    ("{{ messages[5].content.upper() }}", "UndefinedError"),
    ("{% for x in 5 %}{% endfor %}", "TypeError"),
])
def test_a_template_failing_on_the_conversation_is_one_line(template, kind):
    with pytest.raises(ChatTemplateError) as caught:
        render_chat(template, HELLO)
    assert str(caught.value).startswith(f"the chat template failed on this conversation: {kind}: ")


def test_parse_refuses_a_broken_template_in_one_line():
    parse_chat_template("{{ messages }}")
    with pytest.raises(ChatTemplateError) as caught:
        parse_chat_template("{% if %}")
    assert str(caught.value).startswith("the chat template does not parse: ")


@pytest.mark.parametrize("messages, line", [
    ([], "messages must be a non-empty list of {role, content} objects"),
    ("hi", "messages must be a non-empty list of {role, content} objects"),
    (b"hi", "messages must be a non-empty list of {role, content} objects"),
    ({"role": "user"}, "messages must be a non-empty list of {role, content} objects"),
    ([{"role": "user", "content": "a"}, "x"], "messages[1] must be an object with a string 'role'"),
    ([{"role": 3, "content": "a"}], "messages[0] must be an object with a string 'role'"),
    ([{"role": "user", "content": 3}], "messages[0].content must be a string or a list of parts"),
    ([{"role": "user", "content": {"text": "a"}}], "messages[0].content must be a string or a list of parts"),
])
def test_each_malformed_message_is_named(messages, line):
    with pytest.raises(InvalidArgumentError, match=f"^{re.escape(line)}$"):
        check_messages(messages)


def test_valid_messages_come_back_as_copies():
    given = [{"role": "user", "content": None}, {"role": "assistant", "content": [{"type": "text", "text": "a"}],
                                                  "name": "bot"}, ({"role": "tool", "content": "r"})]
    out = check_messages(tuple(given))
    assert out == given and all(a is not b for a, b in zip(out, given, strict=True))


def test_a_template_is_compiled_once():
    from gptedge.runtime.modeldir.chat_template import _compiled

    template = "{{ messages | length }} messages"
    assert _compiled(template) is _compiled(template)  # served chat requests reuse it
