"""The real clients of the web target, found once: Node with the playground's npm packages, and Debian's Chromium
driven by Playwright (never a downloaded browser). Tests skip with one line where one is absent; scripts/setup.sh
installs both, so CI runs them. benchmarks/web_bench.py launches Chromium the same way."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gptedge.pack.js_deps import PLAYGROUND_DIR, WebDepsMissing, node_modules

CHROMIUM = os.environ.get("GPTEDGE_CHROMIUM", "/usr/bin/chromium")
NODE = shutil.which("node")
NODE_TIMEOUT_S = 600


def chromium_args() -> list[str]:
    """Headless on a machine with no display, no GPU and no network beyond loopback: no background fetches, no
    sandbox (CI runs as root)."""
    return ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


def _web_deps_reason() -> str | None:
    try:
        node_modules()
    except WebDepsMissing as e:
        return str(e)
    return None


def need_node():
    """Skip (one line) unless node and the playground's node_modules are there."""
    if NODE is None:
        pytest.skip("node is not installed (scripts/setup.sh uses the machine's Node.js)")
    if (why := _web_deps_reason()) is not None:
        pytest.skip(why)


def need_chromium():
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no Chromium at {CHROMIUM} (scripts/setup.sh: apt-get install --no-install-recommends chromium)")
    try:
        import playwright.sync_api  # noqa: F401 - imported only to find out whether it is installed
    except ImportError:
        pytest.skip("the playwright package is not installed (scripts/setup.sh installs it, without a browser)")
    if (why := _web_deps_reason()) is not None:
        pytest.skip(why)


def run_node(script: str, *args: str) -> dict:
    """Run a JS module (text) beside playground.js, so its bare imports resolve to the playground's node_modules;
    -> the JSON object it prints last."""
    path = PLAYGROUND_DIR / f".test-{os.getpid()}.mjs"
    path.write_text(script, encoding="utf-8")
    try:
        done = subprocess.run([NODE, str(path), *args], capture_output=True, text=True, timeout=NODE_TIMEOUT_S,
                              cwd=PLAYGROUND_DIR)
    finally:
        path.unlink()
    if done.returncode != 0:
        raise AssertionError(f"node failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
