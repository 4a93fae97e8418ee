"""The wheel installs into a fresh venv as gptedge.* sub-packages, and its runtime works without torch."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"gptedge": "gptedge", "gptedge.export": "export", "gptedge.runtime": "runtime",
           "gptedge.quantize": "quantize"}


def source_modules() -> set[str]:
    """Every module of the source as its path inside the wheel (the folder export/ is gptedge/export/ there)."""
    out = set()
    for package, folder in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder)
            if package == "gptedge" and rel.parts[0] in ("export", "runtime", "quantize"):
                continue
            out.add("/".join((*package.split("."), *rel.parts)))
    return out


def test_every_package_folder_is_listed_in_pyproject():
    """[tool.setuptools] packages is an explicit list: a new room left out of it would be missing from the wheel."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {name.rpartition("/")[0].replace("/", ".") for name in source_modules() if name.endswith("/__init__.py")}
    assert folders == listed, f"not listed: {sorted(folders - listed)}; listed, no folder: {sorted(listed - folders)}"


@pytest.mark.slow
def test_wheel_in_fresh_venv(tmp_path, gpt2_model_dir):
    run = lambda *cmd, **kw: subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=900, **kw)  # noqa: E731 - a one-line local helper
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
    packed = {name for name in zipfile.ZipFile(wheel).namelist() if name.endswith(".py")}
    assert packed == source_modules(), (sorted(source_modules() - packed), sorted(packed - source_modules()))
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
