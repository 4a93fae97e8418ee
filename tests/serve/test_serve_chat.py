"""POST /v1/chat/completions end to end: the checkpoint's chat template copied at export, rendered as transformers
renders it, served by the real server to the official `openai` client (streaming and not) with generate()'s
tokens for the rendered prompt; a model without a template, --chat-template FILE, and bad bodies."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("jinja2")

from ..support.openai_errors import openai_error  # noqa: E402 - after the skips: the server needs the extras
from ..support.server import NAME, run_serve, start_server, stop_server  # noqa: E402 - after the optional-dependency skips above

pytestmark = pytest.mark.slow  # three real servers, the command's refusals in subprocesses, transformers' templates

TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something about Bath."}]


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory, gpt2_checkpoint):
    """The tiny GPT-2 checkpoint with a chat template in its tokenizer_config.json (eos_token: GPT-2's end of
    text), exported: the template must arrive in the model dir."""
    from gptedge.export.exporter import export_checkpoint

    root = tmp_path_factory.mktemp("chat")
    ck = shutil.copytree(gpt2_checkpoint, root / "ck")
    (ck / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE, "eos_token": "<|endoftext|>"}))
    export_checkpoint(ck, root / "dir", graph_variant="kv_buffer", validate=False)
    return root / "dir"


@pytest.fixture(scope="module")
def server(chat_dir, tmp_path_factory):
    s = start_server(chat_dir, tmp_path_factory.mktemp("log") / "serve.log", "--device", "cpu")
    try:
        yield s
    finally:
        stop_server(s.proc)


@pytest.fixture(scope="module")
def rendered_ids(chat_dir):
    """The prompt ids an independent renderer gives: transformers' apply_chat_template on the dir's tokenizer."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(chat_dir / "tokenizer.json"), eos_token="<|endoftext|>",
                                  chat_template=(chat_dir / "chat_template.jinja").read_text())
    ids = tok.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_export_copies_the_template_and_quantize_keeps_it(chat_dir, tmp_path):
    from gptedge.quantize.quantizer import QuantizeRecipe, quantize_model_dir

    assert (chat_dir / "chat_template.jinja").read_text() == TEMPLATE
    quantize_model_dir(chat_dir, tmp_path / "q", QuantizeRecipe(method="weight-only"))
    assert (tmp_path / "q" / "chat_template.jinja").read_text() == TEMPLATE


def test_chat_completion_and_stream_equal_generate_on_the_rendered_prompt(server, chat_dir, rendered_ids):
    from gptedge.runtime import load

    want = load(chat_dir, device="cpu").generate(rendered_ids, 12, greedy=True, ignore_eos=True)
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60) as client:
        r = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=12, temperature=0,
                                           extra_body={"ignore_eos": True})
        assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
        assert r.choices[0].message.content == want.text and r.choices[0].finish_reason == "length"
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(rendered_ids), 12)
        chunks = list(client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=12, temperature=0,
                                                     stream=True, stream_options={"include_usage": True},
                                                     extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 12 and all(c.object == "chat.completion.chunk" for c in chunks)


def test_logprobs_are_the_chosen_tokens(server):
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
        "model": NAME, "messages": MESSAGES, "max_tokens": 4, "temperature": 0, "logprobs": True, "top_logprobs": 2,
        "ignore_eos": True}).json()
    content = r["choices"][0]["logprobs"]["content"]
    assert len(content) == 4 and all(len(e["top_logprobs"]) == 2 for e in content)
    assert all(e["logprob"] == e["top_logprobs"][0]["logprob"] for e in content)  # greedy: the best one
    assert "".join(e["token"] for e in content) == r["choices"][0]["message"]["content"]


@pytest.mark.parametrize("body, param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"content": "no role"}]}, "messages"),
    ({"messages": MESSAGES, "n": 17}, "n"),
    ({"messages": MESSAGES, "response_format": {"type": "yaml"}}, "response_format"),
    ({"messages": MESSAGES, "tools": [{"type": "function"}]}, "tools"),
    ({"messages": MESSAGES, "top_logprobs": 2}, "top_logprobs"),
    ({"messages": MESSAGES, "max_tokens": 4, "max_completion_tokens": 4}, "max_completion_tokens"),
    ({"messages": MESSAGES, "frobnicate": 1}, "frobnicate"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages"),
])
def test_bad_bodies_are_one_line_400s(server, body, param):
    r = httpx.post(f"{server.url}/v1/chat/completions", json={"model": NAME, **body}, timeout=60)
    assert openai_error(r, 400)["param"] == param


def test_a_template_that_refuses_the_conversation_is_a_400(tmp_path, gpt2_model_dir):
    strict = tmp_path / "strict.jinja"
    strict.write_text("{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
                      "{{ messages[0]['content'] }}")
    s = start_server(gpt2_model_dir, tmp_path / "serve.log", "--device", "cpu", "--chat-template", str(strict))
    try:
        ok = httpx.post(f"{s.url}/v1/chat/completions", timeout=60,
                        json={"model": NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        assert ok.status_code == 200 and ok.json()["usage"]["prompt_tokens"] == 1  # rendered with FILE's template
        r = httpx.post(f"{s.url}/v1/chat/completions", json={"model": NAME, "messages": MESSAGES}, timeout=60)
        error = openai_error(r, 400)
        assert "user first" in error["message"] and error["code"] == "chat_template_error"
    finally:
        stop_server(s.proc)


def test_a_model_without_a_template_says_so(tmp_path, gpt2_model_dir):
    assert not (Path(gpt2_model_dir) / "chat_template.jinja").exists()
    s = start_server(gpt2_model_dir, tmp_path / "serve.log", "--device", "cpu")
    try:
        r = httpx.post(f"{s.url}/v1/chat/completions", json={"model": NAME, "messages": MESSAGES}, timeout=60)
        error = openai_error(r, 400)
        assert error["code"] == "no_chat_template" and "--chat-template" in error["message"]
    finally:
        stop_server(s.proc)


@pytest.mark.parametrize("content, needle", [(None, "cannot read"), ("{% for m in messages %}", "does not parse")])
def test_chat_template_option_refuses_what_it_cannot_use(tmp_path, gpt2_model_dir, content, needle):
    path = tmp_path / "t.jinja"
    if content is not None:
        path.write_text(content)
    r = run_serve(gpt2_model_dir, "--chat-template", str(path))
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr


def test_an_end_of_turn_token_ends_the_request_as_a_stop(gpt2_loaded):
    """The engine's stop_ids (the chat route passes the tokenizer's eos_token): the first greedy token, named as a
    stop id, ends the request there with finish_reason stop."""
    from gptedge.runtime.generation.sampling import SamplingParams
    from gptedge.runtime.serving.engine import CompletionRequest, Engine

    from ..support.engine import Collector

    prompt = gptedge_ids = gpt2_loaded.encode("Hello there")
    first = gpt2_loaded.generate(gptedge_ids, 1, greedy=True, ignore_eos=True).ids[0]
    engine = Engine(gpt2_loaded, max_batch=1).start()
    try:
        done = Collector()
        engine.submit(CompletionRequest(tuple(prompt), 8, SamplingParams(greedy=True), stop_ids=(first,)), done)
        assert done.finished()
    finally:
        engine.stop(grace_s=1)
    assert done.last.generation.ids == [first] and str(done.last.finish_reason) == "stop"
