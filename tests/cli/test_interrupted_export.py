"""An export stopped midway: SIGTERM or SIGINT leaves nothing behind (one `Error:` line, exit 143 or 130); a killed
one leaves its marked partial dir, which the next run writing the same output sweeps."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ..support.cli import COMMAND, HOME, run_cli
from ..support.invocations import place, snapshot

pytestmark = pytest.mark.slow  # real exports in a subprocess, stopped midway


def _start_export(work: Path, out: str) -> tuple[subprocess.Popen, Path]:
    """An export running in the background, once its partial dir exists and is marked (it then builds and
    validates)."""
    env = {**os.environ, "HOME": str(HOME)}
    proc = subprocess.Popen([*COMMAND, "export", "ck", "-o", out], cwd=work, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        partial = next(work.glob(f".{out}.partial-*"), None)
        if partial is not None and (partial / ".gptedge-partial").is_file():
            return proc, partial
        time.sleep(0.01)
    proc.kill()
    pytest.fail(f"no partial dir appeared: {proc.communicate(timeout=60)}")


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_interrupted_export_leaves_nothing(inputs, work, sig, code):
    place(work, inputs, "ck")
    before = snapshot(work)
    proc, _ = _start_export(work, "out")
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("Error:")]
    assert errors == [f"Error: {'terminated (SIGTERM)' if sig == signal.SIGTERM else 'interrupted'}; "
                      "partial output removed"] and "Traceback" not in stderr
    assert snapshot(work) == before


def test_killed_export_is_swept_by_the_next_run(inputs, work):
    place(work, inputs, "ck", "m")
    proc, partial = _start_export(work, "out")
    proc.kill()
    proc.communicate(timeout=60)
    assert partial.is_dir() and json.loads((partial / ".gptedge-partial").read_text())["pid"] == proc.pid
    result = run_cli(["quantize", "m", "-o", "out", "--method", "dynamic"], work)  # the next run writing `out`
    assert result.returncode == 0, result.stderr
    assert not partial.exists() and not list(work.glob(".out.*"))
    assert not (work / "out" / ".gptedge-partial").exists()
