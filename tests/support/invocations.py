"""The table of bad invocations (tests/cli/test_bad_*.py): a Row is one run of the real `gptedge` command in a
folder of its own holding copies of what it reads (the source checkpoint, the input model, a text). check_row
asserts the exit code (2: the command line is wrong, 1: the work failed), exactly one `Error:` line on stderr
saying what it should, no traceback, and that folder (the source, the input model and OUT's parent) byte for byte
as it was.

Root ignores file modes, so when the tests run as root the rows about read-only folders run the command without
the capabilities that let root do so (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH)."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .cli import error_line, run_cli


def place(work: Path, inputs: dict[str, Path], *names: str) -> None:
    for name in names:
        src = inputs[name]
        shutil.copytree(src, work / name) if src.is_dir() else shutil.copyfile(src, work / name)


def snapshot(folder: Path) -> dict[str, str]:
    """Every path under `folder` with its bytes' sha256 (folders: 'dir')."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        out[rel] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def read_only(path: Path) -> Callable[[Path], None]:
    def make(work: Path) -> None:
        (work / path).mkdir(parents=True, exist_ok=True)
        (work / path).chmod(0o555)
    return make


def edit_manifest(path: Path, **shape) -> None:
    data = json.loads(path.read_text())
    data["shape"].update(shape)
    if "n_layer" in shape:
        data["inputs"] = data["outputs"] = []
    path.write_text(json.dumps(data))


def drop_records(path: Path) -> None:
    """As a manifest an older gptedge wrote: format 1, no file sizes or hashes (a format-2 manifest without them is
    refused at load: tests/modeldir/test_dir_pipeline.py)."""
    data = json.loads(path.read_text())
    data.pop("files", None)
    data["parity"].pop("fingerprint", None)
    data["format_version"] = 1
    path.write_text(json.dumps(data))


def bad_checkpoint(work: Path, breakage: str) -> None:
    ck = work / "ck"
    if breakage == "no_config":
        (ck / "config.json").unlink()
    elif breakage == "bad_json":
        (ck / "config.json").write_text("{")
    elif breakage == "model_type":
        (ck / "config.json").write_text(json.dumps({**json.loads((ck / "config.json").read_text()),
                                                    "model_type": "mamba"}))
    elif breakage == "no_weights":
        (ck / "model.safetensors").unlink()
    else:
        (ck / "model.safetensors").write_bytes(b"\x00" * 64)


@dataclass
class Row:
    id: str
    args: list[str]
    code: int
    says: str
    uses: tuple[str, ...] = ()  # copied into the row's folder from `inputs`
    setup: Callable[[Path], None] | None = None  # then this breaks / prepares something
    cwd: str = "."
    env: dict[str, str] = field(default_factory=dict)
    modes: bool = False  # about file modes: as root, run without the capabilities that ignore them
    skip: Callable[[], str | None] | None = None


def cuda_present() -> str | None:
    from gptedge.runtime.graphs.session import CUDA_PROVIDER, available_providers

    return "this machine has the CUDA provider" if CUDA_PROVIDER in available_providers() else None


def rm(rel: str) -> Callable[[Path], None]:
    return lambda work: (work / rel).unlink()


def check_row(row: Row, inputs: dict[str, Path], work: Path) -> None:
    """Run the row in `work` and assert its exit code, its one error line and `work` unchanged."""
    if row.skip and (why := row.skip()):
        pytest.skip(why)
    place(work, inputs, *row.uses)
    if row.setup:
        row.setup(work)
    before = snapshot(work)
    result = run_cli(row.args, work / row.cwd, row.env, row.modes)
    assert result.returncode == row.code, (result.returncode, result.stderr)
    line = error_line(result)
    assert row.says in line, line
    assert snapshot(work) == before
