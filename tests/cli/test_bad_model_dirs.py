"""A broken model dir (`gptedge info` and `generate` on it): a missing or corrupt manifest, graph or tokenizer,
and a manifest that disagrees with config.json or with the graph, each named in one line; --debug shows the
traceback.

The rows and what each asserts: tests/support/invocations.py."""

from __future__ import annotations

import json

import pytest

from ..support.cli import run_cli
from ..support.invocations import Row, check_row, place, drop_records, edit_manifest, rm

pytestmark = pytest.mark.slow  # each row runs the real command in a subprocess

ROWS = [
    Row("int8-without-manifest", ["info", "q"], 1, "no gptedge.json, yet gptedge wrote this graph", ("q",),
        rm("q/gptedge.json")),
    Row("dir-without-manifest-or-config", ["info", "."], 1, "no gptedge.json and no config.json"),
    Row("corrupt-manifest", ["info", "m"], 1, "corrupt manifest", ("m",),
        lambda w: (w / "m" / "gptedge.json").write_text("{ not json")),
    Row("corrupt-graph", ["info", "m"], 1, "model.onnx is 700 bytes, gptedge.json records", ("m",),
        lambda w: (w / "m" / "model.onnx").write_bytes(b"garbage" * 100)),
    Row("corrupt-graph-old-manifest", ["info", "m"], 1, "ONNX Runtime cannot load it", ("m",),  # no sizes recorded
        lambda w: ((w / "m" / "model.onnx").write_bytes(b"garbage" * 100), drop_records(w / "m" / "gptedge.json"))),
    Row("missing-graph", ["info", "m"], 1, "no model.onnx", ("m",), rm("m/model.onnx")),
    *[Row(f"manifest-graph-mismatch-{k}", ["info", "m"], 1, says, ("m",),
          lambda w, k=k, v=v: edit_manifest(w / "m" / "gptedge.json", **{k: v}))
      for k, v, says in [
          ("n_layer", 3, "gptedge.json says n_layer 3, config.json says n_layer 2"),
          ("n_head", 2, "gptedge.json says n_head 2, config.json says n_head 4"),
          ("head_dim", 16, "gptedge.json says n_embd 64, config.json says n_embd 32"),
          ("vocab_size", 50000, "gptedge.json says vocab_size 50000, config.json says vocab_size 50257"),
          ("context_length", 1024, "gptedge.json says context_length 1024, the graph's position table holds 128")]],
    *[Row(f"manifest-graph-mismatch-{k}-no-config", ["info", "m"], 1, says, ("m",),
          lambda w, k=k, v=v: (edit_manifest(w / "m" / "gptedge.json", **{k: v}), rm("m/config.json")(w),
                               rm("m/generation_config.json")(w)))
      for k, v, says in [
          ("n_layer", 3, "says n_layer 3, the graph has 2 layers"),
          ("n_head", 2, "says n_head 2, the graph has 4"),
          ("head_dim", 16, "says head_dim 16, the graph has 8")]],
    Row("manifest-names-graph-mismatch", ["info", "m"], 1, "graph does not match gptedge.json", ("m",),
        lambda w: (w / "m" / "gptedge.json").write_text(json.dumps(
            {**(d := json.loads((w / "m" / "gptedge.json").read_text())),
             "inputs": d["inputs"] + ["past_key_values.2.key"]}))),
    Row("missing-tokenizer", ["generate", "m", "-p", "Hi"], 1, "tokenizer.json is missing (gptedge.json records",
        ("m",),
        rm("m/tokenizer.json")),
    Row("missing-tokenizer-old-manifest", ["generate", "m", "-p", "Hi"], 1, "no tokenizer.json", ("m",),
        lambda w: (rm("m/tokenizer.json")(w), drop_records(w / "m" / "gptedge.json"))),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_invocation(row: Row, inputs, work):
    check_row(row, inputs, work)


def test_debug_shows_the_traceback(inputs, work):
    place(work, inputs, "m")
    (work / "m" / "model.onnx").write_bytes(b"garbage")
    for args, env in ((["--debug", "info", "m"], {}), (["info", "m"], {"GPTEDGE_DEBUG": "1"})):
        result = run_cli(args, work, env)
        assert result.returncode == 1 and "Traceback" in result.stderr
        assert result.stderr.strip().splitlines()[-1].startswith("Error: ")
