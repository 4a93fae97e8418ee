"""The one way tests run `gptedge serve` as a real server: a subprocess on a free loopback port (`--port 0`; the
port is read from its startup line), up once /health answers 200, killed at the end. run_serve runs the command
to its exit, for the option checks that must refuse before serving."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

NAME = "tiny"  # --model-name of every server started here
START_BOUND_S = 120  # a bound, not a measure: a loaded machine still starts the server well within it


def _env(extra: dict | None = None) -> dict:
    """The environment without GPTEDGE_API_KEY (a test passes --api-key when it wants one), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k != "GPTEDGE_API_KEY"}
    env.update(extra or {})
    return env


class Server:
    def __init__(self, proc: subprocess.Popen, url: str, log: Path):
        self.proc, self.url, self.log = proc, url, log

    def metrics(self) -> dict[str, float]:
        import httpx

        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        return {k: float(v) for k, v in re.findall(r"^(\S+) (\S+)$", text, re.M)}


def start_server(model_dir: Path, log: Path, *args: str) -> Server:
    """`gptedge serve MODEL_DIR --port 0 --threads 1 --model-name tiny ARGS`, its stderr in `log`."""
    import httpx

    cmd = [sys.executable, "-m", "gptedge.cli", "serve", str(model_dir), "--port", "0", "--threads", "1",
           "--model-name", NAME, *args]
    with open(log, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=_env())
    try:
        deadline = time.monotonic() + START_BOUND_S
        while time.monotonic() < deadline and proc.poll() is None:
            found = re.search(r"on (http://127\.0\.0\.1:\d+)", log.read_text())
            if found:
                server = Server(proc, found.group(1), log)
                while time.monotonic() < deadline:
                    try:
                        if httpx.get(f"{server.url}/health", timeout=5).status_code == 200:
                            return server
                    except httpx.TransportError:
                        pass
                    time.sleep(0.1)
            time.sleep(0.1)
        raise RuntimeError(f"the server did not come up:\n{log.read_text()}")
    except BaseException:
        stop_server(proc)
        raise


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(30)


@contextmanager
def running_server(model_dir: Path, log: Path, *args: str) -> Iterator[Server]:
    """start_server for the length of a `with` block (or a fixture's yield), stopped however it ends."""
    server = start_server(model_dir, log, *args)
    try:
        yield server
    finally:
        stop_server(server.proc)


def run_serve(model_dir: Path, *args: str, env: dict | None = None,
              timeout: float = 120) -> subprocess.CompletedProcess:
    """`gptedge serve MODEL_DIR --port 0 ARGS` run to its exit (text output captured): for options it must refuse."""
    return subprocess.run([sys.executable, "-m", "gptedge.cli", "serve", str(model_dir), "--port", "0", *args],
                          capture_output=True, text=True, timeout=timeout, env=_env(env))
