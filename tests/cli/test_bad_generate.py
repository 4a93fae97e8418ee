"""`gptedge generate` given what it must refuse: prompts and stop strings that are not UTF-8, a read-only cache,
out-of-range threads and sampling values, unknown options and devices, a prompt longer than the context.

The rows and what each asserts: tests/support/invocations.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ..support.invocations import Row, check_row, cuda_present, read_only

pytestmark = pytest.mark.slow  # each row runs the real command in a subprocess

ROWS = [
    Row("prompt-not-utf8", ["generate", "m", "-p", os.fsdecode(b"a\xff")], 2,
        "'--prompt': not valid UTF-8 (byte 0xff at offset 1)", ("m",)),
    Row("stop-not-utf8", ["generate", "m", "-p", "Hi", "--stop", os.fsdecode(b"\xc3(")], 2,
        "'--stop': not valid UTF-8 (byte 0xc3 at offset 0)", ("m",)),
    Row("read-only-cache", ["generate", "-p", "Hi"], 1, "GPTEDGE_CACHE", (), read_only(Path("cache")),
        modes=True),
    Row("stop-empty", ["generate", "m", "-p", "Hi", "--stop", "x", "--stop", ""], 2,
        "'--stop': a stop string is empty (it would end the text before it starts); leave it out", ("m",)),
    Row("threads-negative", ["generate", "m", "-p", "Hi", "--threads", "-3"], 2,
        "'--threads': -3 is not in the range 1<=x<=", ("m",)),
    Row("threads-too-many", ["generate", "m", "-p", "Hi", "--threads", "1000"], 2,
        "'--threads': 1000 is not in the range 1<=x<=", ("m",)),
    Row("unknown-option", ["generate", "m", "-p", "Hi", "--temp", "0.5"], 2, "No such option '--temp'", ("m",)),
    Row("missing-model-dir", ["generate", "nope", "-p", "x"], 1, "no such model directory"),
    Row("unknown-device", ["generate", "m", "-p", "x", "--device", "tpu"], 2, "'tpu' is not one of", ("m",)),
    Row("missing-cuda-provider", ["generate", "m", "-p", "x", "--device", "cuda"], 1,
        "needs the CUDA execution provider", ("m",), skip=cuda_present),
    Row("prompt-longer-than-context", ["generate", "m", "-p", "word " * 200], 2, "context holds 128", ("m",)),
    *[Row(f"bad-sampling{args[0]}", ["generate", "m", "-p", "Hi", *args], 2, says, ("m",)) for args, says in [
        (["--top-p", "0"], "top_p must be in (0, 1], got 0.0"),
        (["--temperature", "-1"], "temperature must be a finite number >= 0"),
        (["--top-k", "-1"], "'--top-k': -1 is not in the range x>=0"),
        (["--repetition-penalty", "0"], "repetition_penalty must be a number > 0"),
        (["-n", "0"], "'--max-new-tokens': 0 is not in the range x>=1")]],
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_invocation(row: Row, inputs, work):
    check_row(row, inputs, work)
