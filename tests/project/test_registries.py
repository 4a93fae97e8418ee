"""A new family, quantization method, graph variant or peer engine is one module plus one line.

The module is tests/support/toy_members.py; the line is each test's `register` (what a line in runtime/registry.py
or gptedge/measure/peers/__init__.py does). Registered, the toy is a CLI choice, passes the manifest check, runs,
and `gptedge info` lists it; unregistered, the same command line or manifest is refused in one line.
"""

from __future__ import annotations

import json
import shutil

import pytest

from gptedge.cli import main
from gptedge.measure.peers import PEERS, PeerEntry
from gptedge.runtime import load
from gptedge.runtime.errors import ModelDirError
from gptedge.runtime.modeldir.manifest import MANIFEST_NAME, read_manifest
from gptedge.runtime.registry import (FAMILIES, GRAPH_VARIANTS, QUANTIZATION_METHODS, Entry, FamilyEntry, GraphEntry,
                                      MethodEntry, Registry)

from ..support.checkpoints import tiny_reference, write_checkpoint
from ..support.toy_members import TOY_ARCH, TOY_GRAPH, TOY_METHOD, TOY_PEER, ToyGraph

TOYS = "tests.support.toy_members"

# The toy method is dynamic's rewrite under another name: its line declares the ops it writes, as dynamic's does
# (a manifest's method is checked against them at load).
TOY_METHOD_LINE = MethodEntry(TOYS, ops=QUANTIZATION_METHODS.entry("dynamic").ops)


@pytest.fixture
def registered():
    """The one line of each toy, added for the test and taken away after it."""
    lines = [(FAMILIES, TOY_ARCH, FamilyEntry(TOYS)), (QUANTIZATION_METHODS, TOY_METHOD, TOY_METHOD_LINE),
             (GRAPH_VARIANTS, TOY_GRAPH, GraphEntry(TOYS)), (PEERS, TOY_PEER, PeerEntry(TOYS, bench=True, compare=True,
                                                                                    checkpoint=False))]
    for registry, name, entry in lines:
        registry.register(name, entry)
    yield
    for registry, name, _ in lines:
        registry.unregister(name)


def info(runner, model_dir) -> dict:
    result = runner.invoke(main, ["info", str(model_dir), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_a_registry_refuses_what_it_does_not_hold():
    registry = Registry("thing", "THING", {"a": Entry("x")})
    with pytest.raises(ModelDirError, match="manifest thing 'b' is not one of a"):
        registry.check("b", ModelDirError, where="manifest thing")
    registry.register("b", Entry("y"))
    assert registry.names() == ("a", "b") and "b" in registry
    with pytest.raises(Exception, match="already registered"):
        registry.register("b", Entry("y"))


def test_every_member_is_what_its_line_names():
    """Each registered module defines the member its line promises, under the line's name."""
    assert [FAMILIES.load(a).arch for a in FAMILIES] == list(FAMILIES)
    assert [QUANTIZATION_METHODS.load(m).name for m in QUANTIZATION_METHODS] == list(QUANTIZATION_METHODS)
    assert [GRAPH_VARIANTS.load(g).name for g in GRAPH_VARIANTS] == list(GRAPH_VARIANTS)
    for name in PEERS:
        engine, entry = PEERS.load(name), PEERS.entry(name)
        assert engine.name == name and (engine.bench is not None) == entry.bench
        assert (engine.scorer is not None) == entry.compare and (not entry.compare or engine.recipes)


def test_toy_family(registered, runner, tmp_path):
    checkpoint = write_checkpoint(tiny_reference(TOY_ARCH, seed=5), tmp_path / "ck")
    assert json.loads((checkpoint / "config.json").read_text())["model_type"] == TOY_ARCH  # the family wrote it
    result = runner.invoke(main, ["export", str(checkpoint), "-o", str(tmp_path / "m")])
    assert result.exit_code == 0, result.output  # validated against the toy family's own reference
    shown = info(runner, tmp_path / "m")
    assert shown["manifest"]["shape"]["arch"] == TOY_ARCH and TOY_ARCH in shown["registered"]["families"]
    FAMILIES.unregister(TOY_ARCH)
    with pytest.raises(ModelDirError, match=f"manifest arch '{TOY_ARCH}' is not one of gpt2, openai-gpt"):
        read_manifest(tmp_path / "m")
    FAMILIES.register(TOY_ARCH, FamilyEntry(TOYS))  # for the fixture to take away


def test_toy_quantization_method(runner, gpt2_model_dir, tmp_path):
    args = ["quantize", str(gpt2_model_dir), "-o", str(tmp_path / "toy"), "--method", TOY_METHOD]
    refused = runner.invoke(main, args)
    assert refused.exit_code == 2 and f"'{TOY_METHOD}' is not one of" in refused.output
    QUANTIZATION_METHODS.register(TOY_METHOD, TOY_METHOD_LINE)
    try:
        assert TOY_METHOD in runner.invoke(main, ["quantize", "-h"]).output
        result = runner.invoke(main, args)
        assert result.exit_code == 0, result.output
        result = runner.invoke(main, [*args[:3], str(tmp_path / "dynamic"), "--method", "dynamic"])
        assert result.exit_code == 0, result.output
        shown = info(runner, tmp_path / "toy")
        assert shown["manifest"]["quantization"]["method"] == TOY_METHOD
        assert TOY_METHOD in shown["registered"]["quantization_methods"]
        # the same method under another name: the same graph
        assert (tmp_path / "toy" / "model.onnx").read_bytes() == (tmp_path / "dynamic" / "model.onnx").read_bytes()
    finally:
        QUANTIZATION_METHODS.unregister(TOY_METHOD)
    with pytest.raises(ModelDirError, match=f"unknown method '{TOY_METHOD}'"):
        read_manifest(tmp_path / "toy")


def test_toy_graph_variant(registered, runner, monkeypatch, gpt2_model_dir, gpt2_loaded, gpt2_checkpoint, tmp_path):
    import gptedge.export.exporter as exporter

    toy = tmp_path / "toy"
    shutil.copytree(gpt2_model_dir, toy)
    manifest = json.loads((toy / MANIFEST_NAME).read_text())
    (toy / MANIFEST_NAME).write_text(json.dumps({**manifest, "graph": TOY_GRAPH}))
    loaded = load(toy, device="cpu")
    assert type(loaded.variant) is ToyGraph
    assert loaded.generate("Hello", 12, greedy=True).ids == gpt2_loaded.generate("Hello", 12, greedy=True).ids
    shown = info(runner, toy)
    assert shown["manifest"]["graph"] == TOY_GRAPH and TOY_GRAPH in shown["registered"]["graph_variants"]
    calls, written = [], read_manifest(gpt2_model_dir)
    monkeypatch.setattr(exporter, "export_checkpoint", lambda *a, **k: calls.append(k) or written)
    result = runner.invoke(main, ["export", str(gpt2_checkpoint), "-o", str(tmp_path / "x"), "--graph", TOY_GRAPH])
    assert result.exit_code == 0 and calls[0]["graph_variant"] == TOY_GRAPH, result.output  # an `export --graph` choice
    GRAPH_VARIANTS.unregister(TOY_GRAPH)
    with pytest.raises(ModelDirError, match=f"manifest graph '{TOY_GRAPH}' is not one of standard, kv_buffer"):
        load(toy, device="cpu")
    GRAPH_VARIANTS.register(TOY_GRAPH, GraphEntry(TOYS))


def test_toy_peer_engine(registered, runner, gpt2_model_dir, gpt2_checkpoint, tmp_path):
    result = runner.invoke(main, ["bench", str(gpt2_model_dir), "--prompt", "4", "--new", "4", "--repeat", "1",
                                  "--threads", "1", "--peers", TOY_PEER, "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["rows"]
    assert [r["name"] for r in rows] == [f"gptedge {gpt2_model_dir.name}",
                                         "toy peer (gptedge itself)"] and rows[1]["decode_tok_s"] > 0
    (tmp_path / "t.txt").write_text("It is a truth universally acknowledged, that a single man " * 8, encoding="utf-8")
    result = runner.invoke(main, ["compare", str(gpt2_model_dir), "--text", str(tmp_path / "t.txt"), "--prompts", "2",
                                  "--new-tokens", "4", "--threads", "1", "--device", "cpu", "--peers", TOY_PEER,
                                  "--source", str(gpt2_checkpoint), "--json"])
    assert result.exit_code == 0, result.output
    ref, toy = json.loads(result.stdout)
    # the reference GPT scored as a peer: the fp32 graph's twin (rung 3's 1e-4 logits)
    assert toy["model"] == "toy fp32" and toy["peer"] and toy["top1_agreement"] == 1.0 and toy["kl"] < 1e-6
    assert toy["greedy_agreement"] == 1.0
    peers = info(runner, gpt2_model_dir)["registered"]["peers"]
    assert TOY_PEER in peers["bench"] and TOY_PEER in peers["compare"]
    PEERS.unregister(TOY_PEER)
    refused = runner.invoke(main, ["bench", str(gpt2_model_dir), "--peers", TOY_PEER])
    assert refused.exit_code == 2 and f"unknown '{TOY_PEER}'" in refused.output
    PEERS.register(TOY_PEER, PeerEntry(TOYS, bench=True, compare=True, checkpoint=False))
