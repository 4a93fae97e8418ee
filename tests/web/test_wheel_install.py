"""`pack --target web` from a wheel install: the wheel built from this source, installed into a fresh venv (its
dependencies are this environment's, through a .pth), has no JavaScript; `pack` refuses with the command to run,
`gptedge fetch-web` fetches the pinned tarballs (served from loopback: no network in tests), and `pack` then writes
the playground with vendor files byte-identical to the source checkout's node_modules."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

from gptedge.pack.js_deps import PLAYGROUND_DIR, VENDOR_DIRS, VENDOR_FILES, missing_vendor_file

from ..support.checkpoints import ROOT
from ..support.npm_registry import registry_for, serve_registry

pytestmark = pytest.mark.slow  # a wheel built and installed, and three commands in subprocesses (~30 s)

SOURCE = ("pyproject.toml", "README.md", "LICENSE", "gptedge", "export", "runtime", "quantize")


def run(args: list, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


def dependency_paths() -> list[str]:
    """This environment's site-packages (where the dependencies are; the .pth files there are not run from a path
    a .pth names, so this checkout's editable install does not come along)."""
    paths = {sysconfig.get_paths()["purelib"], *(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))}
    return sorted(p for p in paths if Path(p).is_dir())


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory):
    """-> (the venv's bin folder, registry routes): the source (its lock pinning tarballs made from the checkout's
    node_modules) built as a wheel and installed, without dependencies, into a fresh venv."""
    checkout_modules = PLAYGROUND_DIR / "node_modules"
    if missing_vendor_file(checkout_modules):
        pytest.skip("the playground's node_modules is not installed (scripts/setup.sh runs npm ci)")
    try:  # pyproject's build-system; built here without isolation, so from this environment, offline
        setuptools_major = int(version("setuptools").split(".")[0])
    except PackageNotFoundError:
        setuptools_major = 0
    if setuptools_major < 77:
        pytest.skip("building the wheel offline needs setuptools >= 77 in this environment (pyproject's build-system)")
    root = tmp_path_factory.mktemp("wheel")
    source = root / "src"
    source.mkdir()
    for name in SOURCE:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, source / name, ignore=shutil.ignore_patterns("node_modules", "__pycache__"))
        else:
            shutil.copyfile(src, source / name)
    lock = json.loads((PLAYGROUND_DIR / "package-lock.json").read_text())
    test_lock, routes = registry_for(checkout_modules, lock)
    (source / "gptedge" / "playground" / "package-lock.json").write_text(json.dumps(test_lock, indent=2))
    built = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", root / "dist",
                 source], dict(os.environ), root)
    assert built.returncode == 0, built.stderr
    wheel = next((root / "dist").glob("gptedge-*.whl"))
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", root / "venv"], check=True)
    bin_dir = root / "venv" / "bin"
    purelib = run([bin_dir / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                  dict(os.environ), root).stdout.strip()
    (Path(purelib) / "zz_dependencies.pth").write_text("\n".join(dependency_paths()) + "\n")
    installed = run([bin_dir / "python", "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel],
                    dict(os.environ), root)
    assert installed.returncode == 0, installed.stderr
    return bin_dir, routes


def test_pack_web_from_a_wheel(wheel_venv, gpt2_model_dir, tmp_path):
    bin_dir, routes = wheel_venv
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPTEDGE_", "PYTHON"))}
    env.update(HOME=str(tmp_path), GPTEDGE_CACHE=str(tmp_path / "cache"), VIRTUAL_ENV=str(bin_dir.parent))
    where = run([bin_dir / "python", "-c", "import gptedge, pathlib; print(pathlib.Path(gptedge.__file__).parent)"],
                env, tmp_path)
    package = Path(where.stdout.strip())
    assert package.is_relative_to(bin_dir.parent) and not (package / "playground" / "node_modules").exists()
    assert all((package / "playground" / name).is_file() for name in ("package-lock.json", "index.html"))

    refused = run([bin_dir / "gptedge", "pack", gpt2_model_dir, "--target", "web", "-o", tmp_path / "a"], env, tmp_path)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert "run `gptedge fetch-web`" in refused.stderr and not (tmp_path / "a").exists()

    with serve_registry(routes) as url:
        fetched = run([bin_dir / "gptedge", "fetch-web", "--registry", url], env, tmp_path)
    assert fetched.returncode == 0, fetched.stderr
    assert Path(fetched.stdout.strip()).is_relative_to(tmp_path / "cache" / "web")

    packed = run([bin_dir / "gptedge", "pack", gpt2_model_dir, "--target", "web", "-o", tmp_path / "site"], env,
                 tmp_path)
    assert packed.returncode == 0, packed.stderr
    vendor = tmp_path / "site" / "playground" / "vendor"
    checkout = PLAYGROUND_DIR / "node_modules"
    expected = [*VENDOR_FILES, *(p.relative_to(checkout).as_posix() for d in VENDOR_DIRS
                                 for p in (checkout / d).rglob("*") if p.is_file())]
    assert sorted(p.relative_to(vendor).as_posix() for p in vendor.rglob("*") if p.is_file()) == sorted(expected)
    for name in expected:  # the bytes npm ci installed, through tarballs pinned by integrity
        assert (vendor / name).read_bytes() == (checkout / name).read_bytes(), name
    page = tmp_path / "site" / "playground" / "index.html"
    assert page.read_bytes() == (PLAYGROUND_DIR / "index.html").read_bytes()
