"""The wheel installs into a fresh venv as gptedge.* sub-packages, and its runtime works without torch."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_in_fresh_venv(tmp_path, gpt2_model_dir):
    run = lambda *cmd, **kw: subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=900, **kw)  # noqa: E731
    built = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(tmp_path / "dist"), str(ROOT))
    # A quiet setup: setuptools has nothing to warn about (the license table, data folders taken for packages).
    for noise in ("SetuptoolsDeprecationWarning", "is absent from the `packages` configuration"):
        assert noise not in built.stdout + built.stderr, noise
    wheel = next((tmp_path / "dist").glob("gptedge-*.whl"))
    top_level = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert "gptedge" in top_level
    assert not top_level & {"export", "runtime", "quantize", "tests"}, top_level
    names = zipfile.ZipFile(wheel).namelist()
    assert {f"gptedge/playground/{f}" for f in ("index.html", "playground.js", "package.json")} <= set(names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), "license-files"
    run(sys.executable, "-m", "venv", str(tmp_path / "venv"))
    py = tmp_path / "venv" / "bin" / "python"
    run(str(py), "-m", "pip", "install", "-q", f"{wheel}[cpu]")
    cli = str(tmp_path / "venv" / "bin" / "gptedge")
    assert "Export GPT-2" in run(cli, "--help").stdout
    assert "0." in run(cli, "--version").stdout
    # No torch in this venv: the runtime must still generate.
    assert run(str(py), "-c", "import importlib.util as u; print(u.find_spec('torch'))").stdout.strip() == "None"
    out = run(cli, "generate", str(gpt2_model_dir), "-p", "Hello world", "-n", "5", "--greedy", "--json",
              cwd=str(tmp_path))
    assert '"stop": "max_new_tokens"' in out.stdout
    # export needs the export extra; without it the error is one line, not a traceback.
    failed = subprocess.run([cli, "export", str(gpt2_model_dir), "-o", str(tmp_path / "x")], capture_output=True,
                            text=True, cwd=str(tmp_path))
    assert failed.returncode != 0 and "Traceback" not in failed.stderr and "gptedge[export]" in failed.stderr
