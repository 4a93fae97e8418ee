"""The adversarial pass (benchmarks/adversarial.py, issue #35) stays runnable: its cases are data over every
command, the server and the Python API (>= 300, ids unique), and a small subset runs through the real harness on
the session's tiny GPT-2 and is judged ok. The whole pass is one command (docs/development.md#the-adversarial-pass)."""

from __future__ import annotations

import sys
from collections import Counter

import pytest

from ..support.checkpoints import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

from adversarial import run_case  # noqa: E402 - benchmarks/ on the path first
from adversarial_cases import cli_cases, dir_cases  # noqa: E402 - benchmarks/ on the path first
from adversarial_http import api_cases, http_cases  # noqa: E402 - benchmarks/ on the path first
from adversarial_setup import Context  # noqa: E402 - benchmarks/ on the path first

COMMANDS = {"export", "quantize", "generate", "eval", "compare", "bench", "info", "verify", "pack", "classify",
            "serve", "api"}
# Cases that need only the tiny GPT-2 dir ({lm}) and a scratch dir: refusals before any work, and two oracles.
SUBSET = ["generate-n-0", "generate-stop-empty", "generate-beams-with-stop", "quantize-weight-only-per-tensor",
          "quantize-dynamic-with-calibration", "quantize-kv-cache-standard-graph", "pack-web-platform",
          "api-max-new-tokens-True", "api-stop-empty", "api-max-new-tokens-np-int64", "api-prompt-past-context",
          "api-decode-past-vocab", "api-round-trip-oracle"]


def all_cases():
    return [*cli_cases(), *dir_cases(), *api_cases(), *http_cases()]


def test_the_cases_cover_every_command_and_are_many():
    cases = all_cases()
    assert len(cases) >= 300
    assert {c.command for c in cases} == COMMANDS
    assert [i for i, n in Counter(c.id for c in cases).items() if n > 1] == []
    assert {c.kind for c in cases} == {"cli", "tampered", "api", "http"}


@pytest.fixture
def ctx(gpt2_model_dir, tmp_path):
    context = Context(tmp_path)
    context.inputs = gpt2_model_dir  # only read: a case that changes it is data-loss
    context.protected = [gpt2_model_dir]
    context.cases.mkdir()
    context.paths.update(lm=str(gpt2_model_dir), missing=str(tmp_path / "no-such-thing"),
                         calib=str(ROOT / "samples" / "calibration" / "emma_ch1-4.txt"))
    return context


def test_a_subset_runs_through_the_harness_and_is_ok(ctx):
    by_id = {c.id: c for c in all_cases()}
    verdicts = {cid: run_case(by_id[cid], ctx) for cid in SUBSET}
    assert {cid: o.verdict for cid, o in verdicts.items() if o.verdict != "ok"} == {}, \
        {cid: o.detail for cid, o in verdicts.items()}
