"""`gptedge export` given what it must refuse: outputs onto or around its source, read-only or foreign
folders, unknown graphs and broken checkpoints.

The rows and what each asserts: tests/support/invocations.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ..support.invocations import Row, check_row, bad_checkpoint, read_only

pytestmark = pytest.mark.slow  # each row runs the real command in a subprocess

ROWS = [
    Row("export-onto-its-source", ["export", "ck", "-o", "ck", "--force"], 2, "ck is the input ck", ("ck",)),
    Row("export-onto-the-folder-holding-it", ["export", "proj/ckpt", "-o", "proj", "--force"], 2,
        "proj holds the input proj/ckpt", ("ck",), lambda w: shutil.copytree(w / "ck", w / "proj" / "ckpt")),
    Row("export-under-read-only-parent", ["export", "ck", "-o", "ro/out"], 1, "ro is not writable", ("ck",),
        read_only(Path("ro")), modes=True),
    Row("export-onto-cwd", ["export", "../ck", "-o", ".", "--force"], 2, ". is the current directory",
        ("ck", "m"), cwd="m"),
    Row("export-onto-parent-of-cwd", ["export", "../../ck", "-o", "..", "--force"], 2,
        ".. holds the current directory", ("ck",), lambda w: (w / "proj" / "sub").mkdir(parents=True),
        cwd="proj/sub"),
    Row("force-onto-a-folder-gptedge-did-not-write", ["export", "ck", "-o", "mine", "--force"], 2,
        "mine is not empty and gptedge did not write it", ("ck",),
        lambda w: (w / "mine").mkdir() or (w / "mine" / "notes.txt").write_text("keep")),
    Row("export-opset-past-the-newest", ["export", "ck", "-o", "x", "--opset", "99999999999999999999"], 2,
        "opset 99999999999999999999 is not supported: choose 17..", ("ck",)),
    Row("export-unknown-graph", ["export", "ck", "-o", "x", "--graph", "paged"], 2, "'paged' is not one of", ("ck",)),
    Row("export-existing-output", ["export", "ck", "-o", "out"], 2, "out exists; pass --force", ("ck",),
        lambda w: (w / "out").mkdir() or (w / "out" / "precious.txt").write_text("keep me")),
    *[Row(f"export-bad-checkpoint-{b}", ["export", "ck", "-o", "out"], 1, says, ("ck",),
          lambda w, b=b: bad_checkpoint(w, b))
      for b, says in [("no_config", "no config.json"), ("bad_json", "not valid JSON"),
                      ("model_type", "model_type 'mamba'"), ("no_weights", "no model.safetensors or pytorch_model.bin"),
                      ("corrupt_weights", "cannot read weights")]],
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_invocation(row: Row, inputs, work):
    check_row(row, inputs, work)
