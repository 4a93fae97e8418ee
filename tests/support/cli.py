"""The one way tests run the `gptedge` command: in process through click's CliRunner (the `runner` fixture of
conftest.py), or as a real subprocess (run_gptedge, and run_cli for the bad-invocation rows: their own HOME,
cache and file-mode rules); and the two checks of a failed run's single `Error:` line."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
GPTEDGE = Path(sys.executable).with_name("gptedge")
COMMAND = [str(GPTEDGE)] if GPTEDGE.exists() else [sys.executable, "-m", "gptedge.cli"]
HOME = Path(tempfile.mkdtemp(prefix="gptedge-bad-home-"))  # ONNX Runtime keeps a cache under $HOME


def run_gptedge(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m gptedge.cli ARGS` in a subprocess, its output captured as text."""
    return subprocess.run([sys.executable, "-m", "gptedge.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def _modes_bind_root() -> None:
    """In the child, before exec: drop root's power to ignore file modes from the bounding set."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def run_cli(args: list[str], cwd: Path, env: dict | None = None, modes_bind: bool = False, **kw):
    """The installed `gptedge` command in `cwd`, with a HOME and GPTEDGE_CACHE of its own and GPTEDGE_DEBUG unset;
    modes_bind: as root, without the capabilities that ignore file modes (a read-only folder stays read-only)."""
    full_env = {k: v for k, v in os.environ.items() if k != "GPTEDGE_DEBUG"}
    full_env.update({"HOME": str(HOME), "GPTEDGE_CACHE": str(cwd / "cache"), **(env or {})})
    return subprocess.run([*COMMAND, *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=300,
                          preexec_fn=_modes_bind_root if modes_bind and AS_ROOT else None, **kw)


def error_line(result) -> str:
    """A subprocess's one `Error:` line on stderr; nothing looks like a traceback."""
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.stderr
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    return errors[0]


def one_line_error(result) -> str:
    """A CliRunner result's one `Error: ` line: it failed, the error is the last line, at most the load diagnostic
    before it, never a traceback."""
    assert result.exit_code != 0
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0] and len(lines) <= 2, result.output
    assert "Traceback" not in result.output
    return errors[0]
