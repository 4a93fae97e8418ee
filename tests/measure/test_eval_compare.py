"""gptedge eval (sliding-window perplexity) and compare, checked against PyTorch."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from click.testing import CliRunner

from gptedge.cli import main
from gptedge.measure.compare import graph_size
from gptedge.runtime.errors import InvalidArgumentError
from gptedge.runtime.generation.evaluate import perplexity, sliding_windows
from gptedge.runtime.modeldir.manifest import read_manifest
from gptedge.runtime.modeldir.model_files import FileRecord

from ..support.checkpoints import EXCERPT, reference_perplexity


@pytest.mark.parametrize("n, context, stride", [(2, 4, 2), (10, 4, 2), (1000, 128, 64), (257, 128, 128), (300, 128, 1)])
def test_windows_score_every_target_once(n, context, stride):
    windows = sliding_windows(n, context, stride)
    scored = [t for w in windows for t in range(w.first_target, w.end)]
    assert scored == list(range(1, n))
    for w in windows:
        assert w.end - w.begin <= context and w.begin < w.first_target
        if w.begin > 0:
            assert w.first_target - w.begin >= context - stride  # enough history before every scored token


def test_windows_reject_short_text():
    with pytest.raises(InvalidArgumentError, match="at least 2"):
        sliding_windows(1, 8)


def test_eval_perplexity_equals_reference(gpt2_loaded, gpt2_checkpoint):
    from gptedge.export.checkpoint import load_checkpoint

    ref, _ = load_checkpoint(gpt2_checkpoint)
    ids = gpt2_loaded.encode(EXCERPT.read_text(encoding="utf-8")[:8000])
    got = perplexity(gpt2_loaded, ids, stride=64)
    want = reference_perplexity(ref, ids, 128, 64)
    assert got.tokens == len(ids) - 1
    assert abs(got.perplexity / want - 1) <= 1e-4, (got.perplexity, want)


@pytest.mark.parametrize("stride", [None, 48])
def test_eval_cli_json(gpt2_model_dir, gpt2_checkpoint, gpt2_loaded, tmp_path, stride):
    """The command's figures against the PyTorch oracle (with --stride, and the default: half the context)."""
    from gptedge.export.checkpoint import load_checkpoint

    text = tmp_path / "t.txt"
    text.write_text(EXCERPT.read_text(encoding="utf-8")[:3000], encoding="utf-8")
    args = ["eval", str(gpt2_model_dir), "--text", str(text), "--json"] + (["--stride", str(stride)] if stride else [])
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    ids = gpt2_loaded.encode(text.read_text(encoding="utf-8"))
    want = reference_perplexity(load_checkpoint(gpt2_checkpoint)[0], ids, 128, stride or 64)
    assert out["tokens"] == len(ids) - 1 and out["tokens_per_s"] > 0
    assert abs(out["perplexity"] / want - 1) <= 1e-4, (out["perplexity"], want)
    assert out["nll"] == pytest.approx(np.log(want), rel=1e-4)


@pytest.mark.slow  # compare's every output, the chart drawn
def test_compare_cli_table_json_markdown_plot(gpt2_model_dir, tmp_path):
    from gptedge.quantize.quantizer import QuantizeRecipe, quantize_model_dir

    quantize_model_dir(gpt2_model_dir, tmp_path / "dyn", QuantizeRecipe("dynamic"))
    text = tmp_path / "t.txt"
    text.write_text(EXCERPT.read_text(encoding="utf-8")[:4000], encoding="utf-8")
    runner = CliRunner()
    args = ["compare", str(gpt2_model_dir), str(tmp_path / "dyn"), "--text", str(text), "--prompts", "3",
            "--new-tokens", "8"]
    result = runner.invoke(main, [*args, "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    keys = {"model", "size_bytes", "perplexity", "delta_ppl_pct", "top1_agreement", "kl", "greedy_agreement",
            "tokens_per_s"}
    assert [r["method"] for r in rows] == ["fp32", "dynamic"] and keys <= set(rows[0])
    ref, dyn = rows
    assert ref["kl"] == pytest.approx(0, abs=1e-12) and ref["top1_agreement"] == 1 and ref["delta_ppl_pct"] == 0
    assert ref["greedy_agreement"] == 1
    assert 0 < dyn["kl"] < 0.01 and 0.8 < dyn["top1_agreement"] < 1 and dyn["size_bytes"] < ref["size_bytes"] / 3
    result = runner.invoke(main, [*args, "--markdown", str(tmp_path / "c.md"), "--plot", str(tmp_path / "c.png")])
    assert result.exit_code == 0, result.output
    assert "| model | method | size MB | perplexity | Δ ppl %" in result.stdout
    table_rows = [line for line in result.stdout.splitlines() if line.startswith("| ") and "| model |" not in line]
    assert [line.split(" | ")[1] for line in table_rows] == ["fp32", "dynamic"]
    assert (tmp_path / "c.md").read_text(encoding="utf-8") == result.stdout
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


def test_the_size_column_is_the_manifests_record_of_the_graph(gpt2_model_dir):
    """compare's size: the graph and its external data as recorded (whatever the data file is named), never the
    tokenizer; an older manifest without records falls back to the files on disk, the same figure."""
    manifest = read_manifest(gpt2_model_dir)
    on_disk = sum((gpt2_model_dir / r.path).stat().st_size for r in manifest.files if r.path != "tokenizer.json")
    assert graph_size(gpt2_model_dir, manifest) == on_disk
    assert graph_size(gpt2_model_dir, dataclasses.replace(manifest, files=())) == on_disk
    renamed = dataclasses.replace(manifest, files=(*manifest.files, FileRecord("weights.bin", 1000, "0" * 64)))
    assert graph_size(gpt2_model_dir, renamed) == on_disk + 1000


def test_compare_bad_text(gpt2_model_dir, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe\x00bad")
    result = CliRunner().invoke(main, ["compare", str(gpt2_model_dir), "--text", str(bad)])
    assert result.exit_code == 1 and "not UTF-8 text" in result.output
    assert np.all([p.name == "bad.txt" for p in tmp_path.iterdir()])
