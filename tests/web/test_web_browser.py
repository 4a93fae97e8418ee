"""A real headless Chromium (Debian's package, driven by Playwright; no browser download) opens the playground:
from `gptedge serve` it generates "on the server" (/v1/completions) and "in this browser" (transformers.js on
onnxruntime-web's WASM, several threads: the page is cross-origin isolated), and from a static copy of a web pack
(any static server, one thread); each prints gptedge's own greedy text.

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

import pytest

from gptedge.runtime import load

from ..support.server import start_server, stop_server
from ..support.web_clients import CHROMIUM, chromium_args, need_chromium

pytestmark = pytest.mark.slow  # the sample model in four recipes, packed and run by real clients

PROMPT = "It is a truth universally acknowledged, that"
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def browser():
    need_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=chromium_args())
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def want(sample_recipe_dirs) -> str:
    return load(sample_recipe_dirs["fp32"], device="cpu").generate(PROMPT, max_new_tokens=NEW_TOKENS, greedy=True).text


def generate_on_page(browser, url: str, mode: str) -> tuple[str, str, bool]:
    """Open the playground, pick the mode, generate greedily -> (output text, status line, cross-origin isolated)."""
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
        return page.eval_on_selector("#output", "e => e.textContent"), status, page.evaluate("crossOriginIsolated")
    finally:
        page.close()


def test_playground_from_gptedge_serve(browser, sample_recipe_dirs, want, tmp_path):
    server = start_server(sample_recipe_dirs["fp32"], tmp_path / "serve.log", "--device", "cpu")
    try:
        text, status, isolated = generate_on_page(browser, f"{server.url}/", "server")
        assert text == want and "on the server" in status and f"{NEW_TOKENS} tokens" in status
        text, status, isolated = generate_on_page(browser, f"{server.url}/?dtype=fp32", "browser")
        assert text == want, status
        assert isolated and re.search(r"in this browser \(WASM, [2-9] threads, fp32\)", status) and "tok/s" in status
    finally:
        stop_server(server.proc)


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
        text, status, isolated = generate_on_page(browser, f"{url}/playground/index.html?dtype=fp32", "browser")
    assert text == want, status
    assert not isolated and "WASM, 1 thread, fp32" in status
