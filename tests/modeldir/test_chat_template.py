"""Chat templates (runtime/modeldir/chat_template.py) rendered as transformers renders them: the same text and the
same token ids as `apply_chat_template` for every template here, found where transformers finds them, sandboxed."""

from __future__ import annotations

import json
import shutil

import pytest

from gptedge.runtime.modeldir.chat_template import (ChatTemplateError, check_messages, find_chat_template,
                                                    render_chat, special_tokens)
from gptedge.runtime.errors import InvalidArgumentError

from ..support.checkpoints import ROOT

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>'"
          " + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
ALTERNATING = (  # a system prompt folded into the first user turn; roles must alternate, or raise_exception
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")
BLOCKS = """{% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>\\n' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>\\n' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>\\n'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %}"""
LOOPS_AND_JSON = ("{%- for m in messages %}{%- if m.role == 'system' %}{%- continue %}{%- endif %}"
                  "{{ m.role }}: {{ m.content | tojson }}{{ '\\n' }}{%- if loop.index > 3 %}{%- break %}{%- endif %}"
                  "{%- endfor %}{%- if add_generation_prompt %}assistant:{%- endif %}")
TEMPLATES = {"chatml": CHATML, "alternating": ALTERNATING, "blocks": BLOCKS, "loops-and-json": LOOPS_AND_JSON}
SPECIALS = ["<|im_start|>", "<|im_end|>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
CONVERSATIONS = [
    [{"role": "user", "content": "Hello there."}],
    [{"role": "system", "content": "You answer in one line."}, {"role": "user", "content": "Café — naïve?"},
     {"role": "assistant", "content": "  Yes, quite.  "}, {"role": "user", "content": "And \"quotes\"\n?"}],
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """GPT-2's BPE with chat special tokens added, and a tokenizer_config.json naming bos / eos."""
    from tokenizers import Tokenizer

    out = tmp_path_factory.mktemp("chat-tok")
    tok = Tokenizer.from_file(str(ROOT / "samples" / "sample-model" / "tokenizer.json"))
    tok.add_special_tokens(SPECIALS)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": {"content": "</s>"}}))
    return out


def _transformers(tokenizer_dir, template):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_dir / "tokenizer.json"), bos_token="<s>",
                                   eos_token="</s>", chat_template=template)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_text_and_ids_equal_transformers_apply_chat_template(tokenizer_dir, name, generation_prompt):
    from tokenizers import Tokenizer

    ours = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    theirs = _transformers(tokenizer_dir, TEMPLATES[name])
    for messages in CONVERSATIONS:
        if name == "alternating" and messages[-1]["role"] != "user" and generation_prompt:
            continue
        text = render_chat(TEMPLATES[name], messages, generation_prompt, special_tokens(tokenizer_dir))
        assert text == theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
        want = theirs.apply_chat_template(messages, tokenize=True, add_generation_prompt=generation_prompt)
        want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
        assert ours.encode(text, add_special_tokens=False).ids == list(want)
        assert any(t in text for t in ("<|im_start|>", "<s>", "<|user|>", "user:")) or name == "loops-and-json"


def test_raise_exception_is_one_line_error():
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        render_chat(ALTERNATING, bad, tokens={"bos_token": "<s>", "eos_token": "</s>"})


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",  # reaching Python objects
    "{% set _ = messages.append({'role': 'x'}) %}{{ messages }}",  # mutating the caller's data
    "{{ cycler.__init__.__globals__.os }}",
])
def test_the_sandbox_refuses_what_a_template_must_not_do(template):
    with pytest.raises(ChatTemplateError):
        render_chat(template, CONVERSATIONS[0])


def test_a_template_that_does_not_parse_says_so():
    with pytest.raises(ChatTemplateError, match="does not parse"):
        render_chat("{% for m in messages %}", CONVERSATIONS[0])


@pytest.mark.parametrize("messages", [[], "hi", [{"content": "no role"}], [{"role": "user", "content": 3}], None])
def test_malformed_messages_are_refused(messages):
    with pytest.raises(InvalidArgumentError):
        check_messages(messages)


def test_found_where_transformers_finds_it(tmp_path, tokenizer_dir):
    assert find_chat_template(tmp_path) is None
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": [
        {"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": CHATML}]}))
    assert find_chat_template(tmp_path) == CHATML  # named templates: the default one
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": BLOCKS}))
    assert find_chat_template(tmp_path) == BLOCKS
    (tmp_path / "chat_template.jinja").write_text(ALTERNATING)
    assert find_chat_template(tmp_path) == ALTERNATING  # the file beside the tokenizer first
    shutil.copy(tokenizer_dir / "tokenizer_config.json", tmp_path / "tokenizer_config.json")
    assert special_tokens(tmp_path) == {"bos_token": "<s>", "eos_token": "</s>"}
