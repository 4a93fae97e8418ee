"""The files beside the graph that other engines read, against the manifest (issue #35): what ONNX Runtime GenAI
reads from genai_config.json (end-of-text id, context, the graph's file and shape), what transformers /
transformers.js read from tokenizer_config.json (model_max_length) and from config.json's id2label (a
classifier's labels). An edit to one of them changes what those engines do with the dir while gptedge's own
runtime, which reads the manifest, would go on as before: each such difference is one line naming both values.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from ..contract import GRAPH_KV_BUFFER
from ..modeldir.chat_template import CHAT_TEMPLATE_FILE, ChatTemplateError, parse_chat_template
from ..modeldir.manifest import MANIFEST_NAME, Manifest

SAYS = f"{MANIFEST_NAME} says"
GENAI_CONFIG, TOKENIZER_CONFIG = "genai_config.json", "tokenizer_config.json"


def read_json(path: Path) -> dict | str | None:
    """The JSON object in `path`; None when there is no such file; a one-line problem when it is not one."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return f"{path.name} cannot be read as JSON ({type(e).__name__}: {str(e).splitlines()[0][:80]})"
    return data if isinstance(data, dict) else f"{path.name} is not a JSON object"


def _genai(m: Manifest, genai: dict) -> list[str]:
    model = genai.get("model") if isinstance(genai.get("model"), dict) else {}
    decoder = model.get("decoder") if isinstance(model.get("decoder"), dict) else {}
    search = genai.get("search") if isinstance(genai.get("search"), dict) else {}
    s = m.shape
    claims = [("eos_id", m.eos_id, "model.eos_token_id", model.get("eos_token_id", None)),
              ("bos_id", m.bos_id, "model.bos_token_id", model.get("bos_token_id", None)),
              ("context_length", s.context_length, "model.context_length", model.get("context_length")),
              ("model_file", m.model_file, "model.decoder.filename", decoder.get("filename"))]
    # (its shape fields are not compared: a graph of another shape than GenAI is told fails there in one line, and
    # graph_check names the manifest's shape claims against the graph itself)
    problems = []
    for name, value, key, found in claims:
        if found is None and value is None:
            continue
        agrees = found == value or (isinstance(found, list) and value in found)  # GenAI takes a list of eos ids
        if not agrees:
            problems.append(f"{SAYS} {name} {value}, {GENAI_CONFIG} says {key} {found}")
    longest = search.get("max_length")
    if isinstance(longest, int) and longest > s.context_length:
        problems.append(f"{GENAI_CONFIG} says search.max_length {longest}, past the model's context "
                        f"{s.context_length}")
    shared = search.get("past_present_share_buffer")
    if shared is not None and bool(shared) != (m.graph == GRAPH_KV_BUFFER):
        problems.append(f"{SAYS} graph {m.graph}, {GENAI_CONFIG} says past_present_share_buffer "
                        f"{str(bool(shared)).lower()}")
    return problems


def _tokenizer_config(m: Manifest, config: dict) -> list[str]:
    longest = config.get("model_max_length")
    if longest is not None and longest != m.shape.context_length:
        return [f"{SAYS} context_length {m.shape.context_length}, {TOKENIZER_CONFIG} says model_max_length {longest}"]
    return []


def _labels(m: Manifest, config: dict) -> list[str]:
    if m.task is None or not m.task.id2label or "id2label" not in config:
        return []
    given = config["id2label"]
    if not isinstance(given, dict) or {str(k): v for k, v in given.items()} != m.task.id2label:
        return [f"{SAYS} the labels are {m.task.labels()}, config.json's id2label says "
                f"{[given.get(str(i)) for i in range(len(given))] if isinstance(given, dict) else given}"]
    return []


def companion_problems(model_dir: Path, m: Manifest, config: dict) -> list[str]:
    """genai_config.json, tokenizer_config.json and config.json's id2label against the manifest (config: config.json
    as read by model_claims)."""
    problems = []
    for name, check in ((GENAI_CONFIG, _genai), (TOKENIZER_CONFIG, _tokenizer_config)):
        data = read_json(model_dir / name)
        if isinstance(data, str):
            problems.append(data)
        elif data is not None:
            problems += check(m, data)
    return problems + _labels(m, config) + _chat_template(model_dir)


def _chat_template(model_dir: Path) -> list[str]:
    """chat_template.jinja parses (what serve's chat route and transformers' apply_chat_template run): a broken one
    would fail every chat request of a server that started fine. Without jinja2 (the serve extra) it is not read."""
    path = model_dir / CHAT_TEMPLATE_FILE
    if not path.is_file() or importlib.util.find_spec("jinja2") is None:
        return []
    try:
        parse_chat_template(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeError, ChatTemplateError) as e:
        return [f"{CHAT_TEMPLATE_FILE}: {str(e).splitlines()[0][:160]}"]
    return []
