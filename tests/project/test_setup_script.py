"""scripts/setup.sh: one line per step on the terminal, the package managers' output in its log (shown when a step
fails), each profile installing its own extras, and nothing reinstalled when nothing changed. Run in its dry-run mode
(commands logged, not run) on a scratch venv path, so nothing is installed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def setup(venv: Path, *args: str, dry: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "GPTEDGE_SETUP_LOG")}
    env |= {"GPTEDGE_VENV": str(venv), "GPTEDGE_SETUP_DRY_RUN": "1" if dry else ""}
    return subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh"), *args], capture_output=True, text=True,
                          env=env, timeout=60)


def test_demo_profile_prints_one_line_a_step_and_installs_only_the_demo_extras(tmp_path):
    venv = tmp_path / "venv"
    done = setup(venv, "demo")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert lines == [f"setup: creating {venv} with python3 ... ok", "setup: updating pip ... ok",
                     "setup: installing torch 2.13.0 (CPU build) ... ok",
                     "setup: installing gptedge[cpu,export,plot,serve] (editable) ... ok"], lines
    log = (venv / "setup.log").read_text()
    assert "pip install -e .[cpu,export,plot,serve]\n" in log and "npm" not in log and "apt-get" not in log
    again = setup(venv, "demo")
    assert again.stderr.splitlines() == [f"setup: {venv} is up to date (demo)"]


def test_test_profile_adds_the_test_extras_and_satisfies_the_demo(tmp_path):
    venv = tmp_path / "venv"
    done = setup(venv, "test")
    assert done.returncode == 0, done.stderr
    assert all(line.startswith("setup: ") for line in done.stderr.splitlines()), done.stderr
    assert "installing gptedge[cpu,export,plot,serve,test,ray,docs] (editable) ... ok" in done.stderr
    # a venv set up for the tests has everything the demo needs: the demo reinstalls nothing
    assert setup(venv, "demo").stderr.splitlines() == [f"setup: {venv} is up to date (demo)"]
    # a changed pyproject.toml (another stamp) reinstalls
    (venv / ".gptedge-installed-test").write_text("0000\n")
    assert "installing torch" in setup(venv, "demo").stderr


def test_a_failed_step_shows_the_log_tail_and_its_path(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fake = venv / "bin" / "python"  # a venv whose pip fails, loudly
    fake.write_text("#!/bin/sh\necho 'pip: collecting things'\necho 'ERROR: no matching distribution' >&2\nexit 3\n")
    fake.chmod(0o755)
    done = setup(venv, "demo", dry=False)
    assert done.returncode == 3
    assert done.stderr.startswith("setup: updating pip ... failed (exit 3)\n")
    assert "ERROR: no matching distribution" in done.stderr and f"the whole log: {venv / 'setup.log'}" in done.stderr


def test_an_unknown_profile_is_refused(tmp_path):
    done = setup(tmp_path / "venv", "everything")
    assert done.returncode == 2 and "usage:" in done.stderr and not (tmp_path / "venv").exists()
