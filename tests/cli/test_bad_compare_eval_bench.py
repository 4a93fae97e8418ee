"""`gptedge compare`, `eval` and `bench` given what they must refuse: reports into read-only or impossible
places, models over other vocabularies, out-of-range windows, unknown peers, texts that are missing or not UTF-8.

The rows and what each asserts: tests/support/invocations.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..support.checkpoints import tiny_reference, write_checkpoint
from ..support.invocations import Row, check_row, read_only

pytestmark = pytest.mark.slow  # each row runs the real command in a subprocess

ROWS = [
    Row("markdown-into-read-only-dir", ["compare", "m", "--text", "text.txt", "--markdown", "ro/t.md"], 1,
        "ro is not writable", ("m", "text.txt"), read_only(Path("ro")), modes=True),
    Row("plot-into-read-only-dir", ["compare", "m", "--text", "text.txt", "--plot", "ro/c.png"], 1,
        "ro is not writable", ("m", "text.txt"), read_only(Path("ro")), modes=True),
    Row("markdown-under-a-file", ["compare", "m", "--text", "text.txt", "--markdown", "text.txt/t.md"], 1,
        "text.txt is not a directory", ("m", "text.txt")),
    Row("markdown-onto-a-folder", ["compare", "m", "--text", "text.txt", "--markdown", "m"], 2,
        "'m' is a directory", ("m", "text.txt")),
    Row("compare-other-vocabulary", ["compare", "m", "v", "--text", "text.txt"], 2,
        "has a vocabulary of 1000 tokens, the reference m 50257", ("m", "v", "text.txt")),
    Row("eval-stride-0", ["eval", "m", "--text", "text.txt", "--stride", "0"], 2,
        "'--stride': 0 is not in the range x>=1", ("m", "text.txt")),
    Row("eval-stride-past-context", ["eval", "m", "--text", "text.txt", "--stride", "129"], 2,
        "stride must be in 1..128, got 129", ("m", "text.txt")),
    Row("compare-max-tokens-0", ["compare", "m", "--text", "text.txt", "--max-tokens", "0"], 2,
        "'--max-tokens': 0 is not in the range x>=2", ("m", "text.txt")),
    Row("compare-prompts-0", ["compare", "m", "--text", "text.txt", "--prompts", "0"], 2,
        "'--prompts': 0 is not in the range x>=1", ("m", "text.txt")),
    Row("bench-context-0", ["bench", "m", "--context", "0"], 2, "'--context': 0 is not in the range x>=2", ("m",)),
    Row("bench-context-too-small", ["bench", "m", "--context", "100", "--new", "128"], 2,
        "prompt -28 + new 128 tokens do not fit the context of 128", ("m",)),
    Row("bench-unknown-peer", ["bench", "m", "--peers", "torch,jax"], 2, "unknown 'jax': choose from", ("m",)),
    Row("compare-unknown-peer", ["compare", "m", "--text", "text.txt", "--peers", "ctranslate2,jax"], 2,
        "unknown 'jax': choose from ctranslate2, llama.cpp, optimum", ("m", "text.txt")),
    Row("compare-peers-source-not-a-checkpoint", ["compare", "m", "--text", "text.txt", "--peers", "ctranslate2",
                                                  "--source", "empty"], 2,
        "empty has no config.json: not a Hugging Face checkpoint dir", ("m", "text.txt"),
        lambda w: (w / "empty").mkdir()),
    Row("compare-peers-no-checkpoint-recorded", ["compare", "v", "--text", "text.txt", "--peers", "optimum"], 1,
        "v: no HF checkpoint recorded for the peers; pass --source DIR", ("v", "text.txt")),
    Row("compare-peers-source-other-vocabulary", ["compare", "m", "--text", "text.txt", "--peers", "ctranslate2",
                                                  "--source", "ck1000"], 2,
        "ck1000 has a vocabulary of 1000 tokens, the reference m 50257: the peers must quantize the reference's own",
        ("m", "text.txt"), lambda w: write_checkpoint(tiny_reference("gpt2", vocab_size=1000), w / "ck1000")),
    Row("compare-text-not-utf8", ["compare", "m", "--text", "bad.txt"], 1, "bad.txt: not UTF-8 text", ("m",),
        lambda w: (w / "bad.txt").write_bytes(b"\xff\xfe\x00bad")),
    Row("text-missing", ["eval", "m", "--text", "none.txt"], 1, "none.txt: No such file or directory", ("m",)),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_invocation(row: Row, inputs, work):
    check_row(row, inputs, work)
