"""The playground routes of `gptedge serve` in-process: the page with cross-origin isolation headers, what it is
told it can do, and that /vendor and /web-model serve only what they should."""

from __future__ import annotations


import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")

from starlette.applications import Starlette  # noqa: E402 - after the optional-dependency skips above
from starlette.testclient import TestClient  # noqa: E402 - after the optional-dependency skips above

from gptedge.runtime.modeldir.manifest import read_manifest  # noqa: E402 - after the optional-dependency skips above
from gptedge.serve.playground import Playground, playground_routes, web_model  # noqa: E402 - after the optional-dependency skips above

from ..support.web_clients import need_node  # noqa: E402 - after the optional-dependency skips above


def client(playground: Playground) -> TestClient:
    return TestClient(Starlette(routes=playground_routes(playground)))


def test_page_and_settings(sample_recipe_dirs):
    fp32 = sample_recipe_dirs["fp32"]
    with web_model(fp32, read_manifest(fp32), "auto") as (folder, unavailable):
        if unavailable and "not installed" in unavailable:
            need_node()  # skips with the one-line reason
        assert unavailable is None and (folder / "onnx" / "model.onnx").is_file()
        c = client(Playground("tiny", True, folder))
        page = c.get("/")
        assert page.status_code == 200 and "importmap" in page.text
        assert page.headers["cross-origin-opener-policy"] == "same-origin"
        assert page.headers["cross-origin-embedder-policy"] == "require-corp"
        assert c.get("/playground.js").headers["content-type"].startswith("text/javascript")
        assert c.get("/playground.json").json() == {
            "title": "gptedge playground", "browser": {"model": "web-model/"},
            "server": {"model": "tiny", "completions": "/v1/completions", "api_key_required": True,
                       "chat_unavailable": "tiny has no chat template (serve --chat-template FILE gives it one)"}}
        wasm = c.get("/vendor/onnxruntime-web/dist/ort-wasm-simd-threaded.wasm")
        assert wasm.status_code == 200 and wasm.headers["content-type"] == "application/wasm"
        assert c.get("/web-model/onnx/model.onnx").content == (fp32 / "model.onnx").read_bytes()
        for outside in ("/vendor/onnxruntime-node/package.json", "/vendor/../package.json",
                        "/web-model/../../etc/passwd", "/web-model/%2e%2e/%2e%2e/etc/passwd", "/web-model/nothing"):
            assert c.get(outside).status_code == 404, outside
    assert not folder.exists()  # the temporary pack goes with the server


def test_browser_mode_off_or_not_web_ready(sample_recipe_dirs, gpt2_kv_buffer_loaded):
    fp32 = sample_recipe_dirs["fp32"]
    with web_model(fp32, read_manifest(fp32), "off") as (folder, unavailable):
        assert folder is None and "--web off" in unavailable
    kvb = gpt2_kv_buffer_loaded.model_dir
    with web_model(kvb, gpt2_kv_buffer_loaded.manifest, "auto") as (folder, unavailable):
        assert folder is None
        if "not installed" not in unavailable:
            assert "kv_buffer" in unavailable
    settings = client(Playground("m", False, None, "why not")).get("/playground.json").json()
    assert settings["browser"] == {"unavailable": "why not"} and settings["server"]["api_key_required"] is False
    assert client(Playground("m", False, None, "x")).get("/web-model/config.json").status_code == 404
    chat = client(Playground("m", False, None, "x", chat=True)).get("/playground.json").json()["server"]
    assert chat["chat"] == "/v1/chat/completions" and "chat_unavailable" not in chat


@pytest.mark.slow  # a real server, then the command's refusal in a subprocess
def test_serve_web_option(sample_recipe_dirs, tmp_path):
    """`gptedge serve --web off`: the page still offers the server, not the browser."""
    import httpx

    from ..support.server import run_serve, start_server, stop_server

    server = start_server(sample_recipe_dirs["fp32"], tmp_path / "serve.log", "--web", "off", "--device", "cpu")
    try:
        settings = httpx.get(f"{server.url}/playground.json", timeout=30).json()
        assert settings["browser"] == {"unavailable": "turned off (serve --web off)"}
        assert settings["server"]["model"] == "tiny"
        assert httpx.get(f"{server.url}/web-model/config.json", timeout=30).status_code == 404
        assert httpx.get(f"{server.url}/", timeout=30).status_code == 200
    finally:
        stop_server(server.proc)
    done = run_serve(sample_recipe_dirs["fp32"], "--web", str(tmp_path), timeout=300)
    assert done.returncode == 1 and "Error: --web" in done.stderr and "gptedge-pack.json" in done.stderr
