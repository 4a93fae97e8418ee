"""Every benchmark script with a command line answers --help: its imports resolve (a file moved under tests/support
left benchmarks/web_bench.py importing a module that was no longer on its path, found only when it was run)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ..support.checkpoints import ROOT

pytestmark = pytest.mark.slow  # ~12 s: every script's imports, in one process

# Runs each script as __main__ with --help in one interpreter (numpy and the rest imported once), restoring sys.argv
# and sys.path between them; prints one line per script that did not exit 0.
PROBE = """
import contextlib, io, runpy, sys
from pathlib import Path
for p in sorted(Path("benchmarks").glob("*.py")):
    src = p.read_text()
    if "argparse" not in src or "__main__" not in src:
        continue
    argv, path0 = sys.argv, list(sys.path)
    sys.argv = [str(p), "--help"]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(str(p), run_name="__main__")
        print(f"{p}: ran past --help")
    except SystemExit as e:
        if e.code not in (0, None):
            print(f"{p}: exit {e.code}")
    except Exception as e:
        print(f"{p}: {type(e).__name__}: {e}")
    finally:
        sys.argv, sys.path[:] = argv, path0
"""


def test_every_benchmark_answers_help():
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "", done.stdout
    scripts = [p for p in (ROOT / "benchmarks").glob("*.py") if "argparse" in p.read_text()]
    assert len(scripts) >= 20  # the probe saw the scripts (a wrong folder would pass silently)
