"""A real headless Chromium (Debian's package, driven by Playwright; no browser download) opens the playground:
from `gptedge serve` it generates "on the server" (/v1/completions) and "in this browser" (transformers.js on
onnxruntime-web's WASM, several threads: the page is cross-origin isolated), and from a static copy of a web pack
(any static server, one thread); each prints gptedge's own greedy text. The chat (a model with a template, here given
by `serve --chat-template`): on the server and in this browser (transformers.js renders the template), each turn's
streamed reply is what /v1/chat/completions answers for the same messages. The pack's golden self-test shows its
verdict when a graph loads: pass for fp32, fail for a 4-bit graph at accuracy level 4 (WASM computes it in float).

fp32 graphs: WASM's float kernels give the Python runtime's greedy ids on the sample model; its int8 kernels round
differently from x86's, so a quantized graph's text may part from the Python one near a tie (benchmarks/web_bench.py
reports that agreement instead)."""

from __future__ import annotations

import contextlib
import functools
import http.server
import re
import subprocess
import sys
import threading

import httpx
import pytest

from gptedge.runtime import load

from ..support.cpus import every_cpu
from ..support.server import start_server, stop_server
from ..support.web_clients import CHROMIUM, chromium_args, need_chromium

pytestmark = pytest.mark.slow  # the sample model in four recipes, packed and run by real clients

PROMPT = "It is a truth universally acknowledged, that"
NEW_TOKENS = 32
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SYSTEM = "You are Miss Austen's narrator."
TURNS = ["Who is Mr. Darcy?", "And what of Elizabeth?"]
CHAT_TOKENS = 16


@pytest.fixture(scope="module")
def browser():
    need_chromium()
    from playwright.sync_api import sync_playwright

    with every_cpu():  # the driver, and the Chromium it starts, may use every CPU: the page's WASM threads follow them
        p = sync_playwright().start()
    try:
        b = p.chromium.launch(executable_path=CHROMIUM, args=chromium_args())
        try:
            yield b
        finally:
            b.close()
    finally:
        p.stop()


@pytest.fixture(scope="module")
def want(sample_recipe_dirs) -> str:
    return load(sample_recipe_dirs["fp32"], device="cpu").generate(PROMPT, max_new_tokens=NEW_TOKENS, greedy=True).text


def generate_on_page(browser, url: str, mode: str) -> tuple[str, str, bool, str]:
    """Open the playground, pick the mode, generate greedily -> (output text, status line, cross-origin isolated,
    self-test line)."""
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(url)
        page.wait_for_selector("body[data-ready=true]", timeout=60_000)
        page.check(f"#mode-{mode}")
        page.select_option("#sampling", "greedy")
        page.fill("#max-tokens", str(NEW_TOKENS))
        page.fill("#prompt", PROMPT)
        page.click("#generate")
        page.wait_for_selector("#output[data-state=done], #output[data-state=error]", timeout=300_000)
        status = page.inner_text("#status")
        assert page.get_attribute("#output", "data-state") == "done", f"{status} {errors}"
        return (page.eval_on_selector("#output", "e => e.textContent"), status, page.evaluate("crossOriginIsolated"),
                page.inner_text("#selftest"))
    finally:
        page.close()


@pytest.fixture(scope="module")
def server(sample_recipe_dirs, tmp_path_factory):
    """The sample model served with a chat template (--chat-template: the sample has none of its own)."""
    root = tmp_path_factory.mktemp("served")
    (root / "chatml.jinja").write_text(CHATML)
    s = start_server(sample_recipe_dirs["fp32"], root / "serve.log", "--device", "cpu", "--chat-template",
                     str(root / "chatml.jinja"))
    try:
        yield s
    finally:
        stop_server(s.proc)


def test_playground_from_gptedge_serve(browser, server, want):
    text, status, isolated, _ = generate_on_page(browser, f"{server.url}/", "server")
    assert text == want and "on the server" in status and f"{NEW_TOKENS} tokens" in status
    text, status, isolated, selftest = generate_on_page(browser, f"{server.url}/?dtype=fp32", "browser")
    assert text == want, status
    assert isolated and re.search(r"in this browser \(WASM, [2-9] threads, fp32\)", status) and "tok/s" in status
    assert selftest.startswith("fp32 self-test: pass (max |Δlogit| = "), selftest


def chat_on_page(browser, url: str, mode: str) -> list[str]:
    """Open the playground's chat, pick the mode, send TURNS one by one (greedy) -> the replies shown."""
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(url)
        page.wait_for_selector("body[data-ready=true]", timeout=60_000)
        page.check(f"#mode-{mode}")
        page.check("#task-chat")
        assert page.is_visible("#chat-panel") and not page.is_visible("#complete-panel")
        page.select_option("#sampling", "greedy")
        page.fill("#max-tokens", str(CHAT_TOKENS))
        page.fill("#system", SYSTEM)
        for turn in TURNS:
            page.fill("#chat-input", turn)
            page.click("#send")
            page.wait_for_selector("#messages[data-state=done], #messages[data-state=error]", timeout=300_000)
            assert page.get_attribute("#messages", "data-state") == "done", f"{page.inner_text('#status')} {errors}"
        roles = page.eval_on_selector_all("#messages .message", "es => es.map(e => e.dataset.role)")
        assert roles == ["user", "assistant"] * len(TURNS)
        replies = page.eval_on_selector_all("#messages .message[data-role=assistant]",
                                            "es => es.map(e => e.textContent)")
        page.click("#clear")
        assert page.eval_on_selector_all("#messages .message", "es => es.length") == 0
        return replies
    finally:
        page.close()


def test_chat_from_gptedge_serve(browser, server):
    """Each turn sends the whole conversation (system prompt, earlier turns); the page shows, streamed, what the API
    answers for the same messages: on the server, and in this browser from the template in the pack."""
    messages, want = [{"role": "system", "content": SYSTEM}], []
    for turn in TURNS:
        messages.append({"role": "user", "content": turn})
        answer = httpx.post(f"{server.url}/v1/chat/completions", timeout=120, json={
            "model": "tiny", "messages": messages, "max_tokens": CHAT_TOKENS, "temperature": 0}).json()
        reply = answer["choices"][0]["message"]["content"]
        messages.append({"role": "assistant", "content": reply})
        want.append(reply)
    assert len(set(want)) == 2 and all(want)  # two different, non-empty replies: the history reached the model
    assert chat_on_page(browser, f"{server.url}/", "server") == want
    assert chat_on_page(browser, f"{server.url}/?dtype=fp32", "browser") == want


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {".js": "text/javascript", ".mjs": "text/javascript", ".wasm": "application/wasm",
                      ".json": "application/json", ".html": "text/html", "": "application/octet-stream"}

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def static_server(root):
    """Any static file server will do: no special headers (so no cross-origin isolation: one WASM thread)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_playground_of_a_static_pack(browser, sample_recipe_dirs, want, tmp_path):
    out = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "gptedge.cli", "pack", str(sample_recipe_dirs["fp32"]),
                           str(sample_recipe_dirs["w4"]), "--target", "web", "-o", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert not (out / "playground" / "vendor" / "onnxruntime-node").exists()  # only what a browser needs
    with static_server(out) as url:
        text, status, isolated, selftest = generate_on_page(browser, f"{url}/playground/index.html?dtype=fp32",
                                                            "browser")
        q4, chat_note, chat_disabled = self_test_of(browser, f"{url}/playground/index.html", "q4")
    assert text == want, status
    assert not isolated and "WASM, 1 thread, fp32" in status
    assert selftest.startswith("fp32 self-test: pass (max |Δlogit| = "), selftest
    # 4-bit at accuracy level 4 (the quantizer's default): WASM computes its activations in float, natively they are
    # quantized per block: another function, which the self-test reports rather than hides
    assert q4.startswith("q4 self-test: fail (max |Δlogit| = ") and "accuracy level 4" in q4, q4
    assert chat_disabled and "no chat template" in chat_note  # the sample has none: no chat in this pack


def self_test_of(browser, url: str, dtype: str) -> tuple[str, str, bool]:
    """Load one graph (the Load button) -> (its self-test line, the chat note, whether chat is disabled)."""
    page = browser.new_page()
    try:
        page.goto(url)
        page.wait_for_selector("body[data-ready=true]", timeout=60_000)
        page.select_option("#dtype", dtype)
        page.click("#load")
        page.wait_for_function(f"document.getElementById('selftest').textContent.startsWith('{dtype} self-test:')",
                               timeout=300_000)
        return page.inner_text("#selftest"), page.inner_text("#chat-note"), page.is_disabled("#task-chat")
    finally:
        page.close()
