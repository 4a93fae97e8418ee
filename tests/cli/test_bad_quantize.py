"""`gptedge quantize` given what it must refuse: an output onto its input or under a read-only folder, an unknown
method, static quantization without calibration text.

The rows and what each asserts: tests/support/invocations.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..support.invocations import Row, check_row, read_only

pytestmark = pytest.mark.slow  # each row runs the real command in a subprocess

ROWS = [
    Row("quantize-onto-its-input", ["quantize", "m", "-o", "m", "--force", "--method", "dynamic"], 2,
        "m is the input m", ("m",)),
    Row("quantize-under-read-only-parent", ["quantize", "m", "-o", "ro/sub/q", "--method", "dynamic"], 1,
        "ro is not writable", ("m",), read_only(Path("ro")), modes=True),
    Row("quantize-unknown-method", ["quantize", "m", "-o", "x", "--method", "fp4"], 2, "'fp4' is not one of", ("m",)),
    Row("quantize-static-without-calibration", ["quantize", "m", "-o", "x", "--method", "static"], 2,
        "--method static needs --calibration", ("m",)),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_invocation(row: Row, inputs, work):
    check_row(row, inputs, work)
