"""`gptedge fetch-web` (gptedge/pack/web_fetch.py) against a local registry of small made-up packages: what is
kept, where js_deps then finds it, and the failures (bad integrity, a dropped connection, Ctrl-C, a lock without
the package) that must leave nothing in the cache. The real packages, a wheel install and `pack --target web`:
test_wheel_install.py."""

from __future__ import annotations

import json
import os
import time

import pytest

from gptedge.cli import main
from gptedge.pack import js_deps, web_fetch
from gptedge.pack.js_deps import VENDOR_DIRS, VENDOR_FILES, WebDepsMissing
from gptedge.pack.web_fetch import WebFetchError, fetch_web_deps

from ..support.npm_registry import registry_for, serve_registry

LOCK = {"name": "gptedge-playground", "lockfileVersion": 3, "packages": {
    "": {"dependencies": {"@huggingface/transformers": "4.3.1"}},
    "node_modules/@huggingface/transformers": {"version": "4.3.1"},
    "node_modules/onnxruntime-web": {"version": "1.31.0"},
    "node_modules/onnxruntime-web/node_modules/onnxruntime-common": {"version": "1.31.0"}}}
EXTRA = ("@huggingface/transformers/LICENSE", f"{VENDOR_DIRS[0]}/index.js", f"{VENDOR_DIRS[0]}/sub/tensor.js")
NOT_KEPT = ("@huggingface/transformers/dist/transformers.node.mjs", "onnxruntime-web/dist/ort.webgpu.mjs",
            "onnxruntime-web/lib/index.ts")


@pytest.fixture
def made_up(tmp_path, monkeypatch):
    """Small packages with every file a browser needs and some it does not, their tarballs and a lock pinning
    them; the cache in tmp_path, no source checkout's node_modules, no GPTEDGE_WEB_MODULES."""
    modules = tmp_path / "src" / "node_modules"
    for name in (*VENDOR_FILES, *EXTRA, *NOT_KEPT):
        (modules / name).parent.mkdir(parents=True, exist_ok=True)
        (modules / name).write_text(f"contents of {name}\n")
    for path, entry in LOCK["packages"].items():  # versions() reads each package.json
        if path:
            name = path.rsplit("node_modules/", 1)[-1]
            (modules / path.removeprefix("node_modules/") / "package.json").write_text(
                json.dumps({"name": name, "version": entry["version"], "license": "MIT"}))
    lock, routes = registry_for(modules, LOCK, keep_all=True)
    (tmp_path / "package-lock.json").write_text(json.dumps(lock))
    monkeypatch.setattr(js_deps, "LOCK", tmp_path / "package-lock.json")
    monkeypatch.setattr(js_deps, "PLAYGROUND_DIR", tmp_path / "installed")  # a wheel: no node_modules beside
    monkeypatch.setenv("GPTEDGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("GPTEDGE_WEB_MODULES", raising=False)
    monkeypatch.delenv("GPTEDGE_NPM_REGISTRY", raising=False)
    return modules, routes, tmp_path / "cache" / "web"


def test_fetch_keeps_what_a_browser_needs_and_js_deps_finds_it(made_up):
    modules, routes, cache = made_up
    with pytest.raises(WebDepsMissing, match="run `gptedge fetch-web`"):
        js_deps.node_modules()
    with serve_registry(routes) as url:
        result = fetch_web_deps(url)
        assert result["fetched"] and result["downloaded"] == sum(len(t) for t in routes.values())
        found = js_deps.node_modules()
        assert found == result["node_modules"] and found.parent.parent == cache
        kept = sorted(p.relative_to(found).as_posix() for p in found.rglob("*") if p.is_file())
        packages = ["@huggingface/transformers", "onnxruntime-web", js_deps.ORT_COMMON]
        assert kept == sorted({*VENDOR_FILES, *EXTRA, *(f"{p}/package.json" for p in packages)})
        for name in kept:
            assert (found / name).read_bytes() == (modules / name).read_bytes(), name
        assert js_deps.versions(found) == {"@huggingface/transformers": "4.3.1", "onnxruntime-web": "1.31.0",
                                           "onnxruntime-common": "1.31.0"}
        record = json.loads((found.parent / js_deps.RECORD).read_text())
        assert record["registry"] == url and [p["path"] for p in record["packages"]] == packages
        again = fetch_web_deps(url)  # once: a second run downloads nothing
        assert not again["fetched"] and again["downloaded"] == 0 and again["node_modules"] == found
        (found / VENDOR_FILES[0]).unlink()  # damaged since: js_deps passes it over, the next fetch replaces it
        with pytest.raises(WebDepsMissing, match="run `gptedge fetch-web`"):
            js_deps.node_modules()
        assert fetch_web_deps(url)["fetched"] and js_deps.node_modules() == found
        assert (found / VENDOR_FILES[0]).read_bytes() == (modules / VENDOR_FILES[0]).read_bytes()
    assert [p.name for p in cache.iterdir()] == [found.parent.name]  # no temporary folder left


def test_env_var_and_checkout_come_before_the_cache(made_up, tmp_path, monkeypatch):
    modules, routes, _ = made_up
    with serve_registry(routes) as url:
        fetch_web_deps(url)
    (tmp_path / "installed").mkdir()
    (tmp_path / "installed" / "node_modules").symlink_to(modules, target_is_directory=True)
    assert js_deps.node_modules() == tmp_path / "installed" / "node_modules"
    monkeypatch.setenv("GPTEDGE_WEB_MODULES", str(tmp_path / "nowhere"))  # named, so refused, not passed over
    with pytest.raises(WebDepsMissing, match="GPTEDGE_WEB_MODULES="):
        js_deps.node_modules()


@pytest.mark.parametrize("failure", ["integrity", "dropped", "interrupted"])
def test_a_failed_fetch_leaves_nothing(made_up, monkeypatch, failure):
    """A tarball that is not the pinned one, a connection dropped halfway, Ctrl-C while extracting: an error (one
    line), an empty cache, and js_deps still asks for the command."""
    _, routes, cache = made_up
    second = sorted(routes)[1]
    truncated = set()
    if failure == "integrity":
        routes = {**routes, second: routes[second][:-8] + b"\0" * 8}
    elif failure == "dropped":
        truncated = {second}
    else:
        extract = web_fetch._extract
        calls = []

        def interrupted(*args):
            calls.append(extract(*args))  # the first package extracted, then Ctrl-C in the second
            if len(calls) == 2:
                raise KeyboardInterrupt
        monkeypatch.setattr(web_fetch, "_extract", interrupted)
    with serve_registry(routes, truncated) as url:
        error = KeyboardInterrupt if failure == "interrupted" else WebFetchError
        with pytest.raises(error) as e:
            fetch_web_deps(url)
    if failure != "interrupted":
        message = str(e.value)
        assert "\n" not in message and second in message
        assert ("integrity mismatch" if failure == "integrity" else "could not download") in message
    assert list(cache.iterdir()) == []
    with pytest.raises(WebDepsMissing, match="gptedge fetch-web"):
        js_deps.node_modules()


def test_a_killed_fetchs_leftovers_go_with_the_next_fetch(made_up):
    """SIGKILL skips the cleanup: its `.tmp-*` folder (never read by js_deps) is removed by the next fetch once it is
    an hour old; a younger one may be a fetch still running, and stays."""
    _, routes, cache = made_up
    old, young = cache / ".tmp-killed", cache / ".tmp-running"
    for folder in (old, young):
        (folder / "node_modules").mkdir(parents=True)
    hours_ago = time.time() - web_fetch.STALE_TMP_S - 60
    os.utime(old, (hours_ago, hours_ago))
    with serve_registry(routes) as url:
        found = fetch_web_deps(url)["node_modules"]
    assert sorted(p.name for p in cache.iterdir()) == sorted([found.parent.name, young.name])


def test_lock_without_the_package_is_one_line(made_up, tmp_path):
    lock = json.loads(js_deps.LOCK.read_text())
    del lock["packages"]["node_modules/onnxruntime-web"]["integrity"]
    js_deps.LOCK.write_text(json.dumps(lock))
    with pytest.raises(WebDepsMissing, match="no version and sha512 integrity for node_modules/onnxruntime-web$"):
        fetch_web_deps("http://127.0.0.1:9")
    assert js_deps.cached_node_modules() is None


def test_fetch_web_command(made_up, runner, monkeypatch):
    """`gptedge fetch-web --registry URL` prints the folder; $GPTEDGE_NPM_REGISTRY does the same; a registry that
    is not an http(s) URL is a bad command line (exit 2)."""
    _, routes, _ = made_up
    with serve_registry(routes) as url:
        done = runner.invoke(main, ["fetch-web", "--registry", url])
        assert done.exit_code == 0, done.output
        assert done.stdout.strip() == str(js_deps.node_modules())
        assert "integrity checked" in done.stderr and "fetched @huggingface/transformers 4.3.1" in done.stderr
        monkeypatch.setenv("GPTEDGE_NPM_REGISTRY", url)
        again = runner.invoke(main, ["fetch-web"])
        assert again.exit_code == 0 and again.stderr.startswith("already fetched: ")
    bad = runner.invoke(main, ["fetch-web", "--registry", "file:///etc"])
    assert bad.exit_code == 2 and "not an http(s) URL" in bad.output


def test_the_shipped_lock_pins_what_the_checkout_installed():
    """The real lock: three sha512 pins at npm's URLs (as npm itself fetched them), and, where `npm ci` ran, the
    versions node_modules holds."""
    pinned = js_deps.pinned_packages()
    assert [p.url(web_fetch.DEFAULT_REGISTRY) for p in pinned][:2] == [
        "https://registry.npmjs.org/@huggingface/transformers/-/transformers-4.3.1.tgz",
        f"https://registry.npmjs.org/onnxruntime-web/-/onnxruntime-web-{pinned[1].version}.tgz"]
    assert pinned[2].path == js_deps.ORT_COMMON and pinned[2].name == "onnxruntime-common"
    assert all(p.integrity.startswith("sha512-") and len(p.integrity) == 95 for p in pinned)
    checkout = js_deps.PLAYGROUND_DIR / "node_modules"
    if js_deps.missing_vendor_file(checkout) is None:
        assert js_deps.versions(checkout) == {p.name: p.version for p in pinned}
