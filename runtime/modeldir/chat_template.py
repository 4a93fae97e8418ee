"""A checkpoint's chat template: where transformers finds it, and rendering it as transformers does.

Where: a model dir (or a Hugging Face checkpoint dir) holds it as `chat_template.jinja` beside the tokenizer, or as
`chat_template` in tokenizer_config.json: a string, or a list of {"name", "template"} of which "default" is the
one a plain chat uses. Export copies it into the model dir as chat_template.jinja (`CHAT_TEMPLATE_FILE`).

How: transformers' own Jinja semantics (`apply_chat_template`): a sandboxed environment (a template is data a
checkpoint brings, so it may not reach Python objects), blocks trimmed (`trim_blocks`, `lstrip_blocks`), the
loop-control extension, `raise_exception(message)` and `strftime_now(format)` as globals, a `tojson` filter that
keeps non-ASCII text and takes `indent`, and the tokenizer's special tokens (`bos_token`, `eos_token`, ...) as
variables beside `messages` and `add_generation_prompt`. The rendered text is tokenized without adding special
tokens again (the template writes them), as apply_chat_template(tokenize=True) does.

jinja2 comes with the `serve` extra; a dir's template is read without it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..errors import GptEdgeError, InvalidArgumentError

CHAT_TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")
ROLES_OF_A_MESSAGE = ("role", "content")  # what every message must have; other keys (name, tool_calls) pass through


class ChatTemplateError(GptEdgeError):
    """A template that does not parse, raises (raise_exception) or fails while rendering: one line."""


def _read_config(folder: Path) -> dict[str, Any]:
    path = folder / TOKENIZER_CONFIG_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ChatTemplateError(f"{path}: not JSON ({e})") from None
    return data if isinstance(data, dict) else {}


def find_chat_template(folder: str | Path) -> str | None:
    """The folder's chat template (chat_template.jinja first, as transformers reads it), or None."""
    folder = Path(folder)
    if (folder / CHAT_TEMPLATE_FILE).is_file():
        return (folder / CHAT_TEMPLATE_FILE).read_text(encoding="utf-8")
    template = _read_config(folder).get("chat_template")
    if isinstance(template, list):  # named templates: the plain chat's is "default"
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) and template.strip() else None


def special_tokens(folder: str | Path) -> dict[str, str]:
    """The tokenizer's special tokens as the template sees them: tokenizer_config.json's strings (or AddedToken
    objects' `content`)."""
    out = {}
    for name, value in _read_config(Path(folder)).items():
        if name in SPECIAL_TOKEN_NAMES:
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str):
                out[name] = value
    return out


def _raise(message: str) -> None:
    raise ChatTemplateError(f"the chat template refused the conversation: {message}")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=16)
def _compiled(template: str):
    try:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ChatTemplateError("chat templates need jinja2: pip install 'gptedge[serve]'") from None
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except TemplateError as e:
        raise ChatTemplateError(f"the chat template does not parse: {e}") from None


def parse_chat_template(template: str) -> None:
    """ChatTemplateError when `template` does not parse (the model dir checks run this on chat_template.jinja)."""
    _compiled(template)


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """A non-empty list of {"role": str, "content": str | list of parts, ...}; InvalidArgumentError otherwise."""
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) or not messages:
        raise InvalidArgumentError("messages must be a non-empty list of {role, content} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise InvalidArgumentError(f"messages[{i}] must be an object with a string 'role'")
        content = m.get("content")
        if not (content is None or isinstance(content, str) or isinstance(content, list)):
            raise InvalidArgumentError(f"messages[{i}].content must be a string or a list of parts")
    return [dict(m) for m in messages]


def render_chat(template: str, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                tokens: Mapping[str, str] | None = None, **extra: Any) -> str:
    """The conversation as the checkpoint's template writes it (text, special tokens included)."""
    from jinja2 import TemplateError

    compiled = _compiled(template)
    try:
        return compiled.render(messages=check_messages(messages), add_generation_prompt=add_generation_prompt,
                               **dict(tokens or {}), **extra)
    except ChatTemplateError:
        raise
    except (TemplateError, TypeError, ValueError, KeyError, AttributeError) as e:
        raise ChatTemplateError(f"the chat template failed on this conversation: {type(e).__name__}: {e}") from None
