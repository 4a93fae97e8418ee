"""The shipped sample model, a GPT-2 really trained on Austen + KJV: export parity, perplexity
against PyTorch, INT8 quality on held-out text, and readable generation at a fixed seed."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from gptedge.cli import main
from gptedge.export.checkpoint import load_checkpoint
from gptedge.export.exporter import export_checkpoint
from gptedge.measure.compare import compare
from gptedge.quantize.quantizer import QuantizeRecipe, quantize_model_dir
from gptedge.runtime import load
from gptedge.runtime.generation.evaluate import perplexity

from ..support.checkpoints import EXCERPT, ROOT, reference_perplexity

# The real 6.9M-parameter model exported, quantized and evaluated end to end: minutes on 2 cores, so it runs in the
# whole suite (CI) and stays out of the fast subset (docs/development.md#tests).
pytestmark = pytest.mark.slow

SAMPLE = ROOT / "samples" / "sample-model"
CALIBRATION = ROOT / "samples" / "calibration" / "emma_ch1-4.txt"
EVAL_TOKENS = 12_000  # of the held-out excerpt: enough for stable figures, fast enough for CI

# Thresholds per method on this model and the first 12,000 tokens of the excerpt. Measured
# (2026-11-22, onnxruntime 1.31.1, x86-64 with AVX512-VNNI):
#   dynamic      Δppl +0.088 %  top-1 98.30 %  KL 4.0e-4
#   static       Δppl +0.131 %  top-1 94.95 %  KL 2.1e-3
#   weight-only  Δppl +0.001 %  top-1 99.09 %  KL 1.1e-4
#   (Optimum's dynamic INT8 of the same checkpoint: Δppl +0.147 %, top-1 96.67 %, KL 1.8e-3)
# KL and top-1 carry the verdict (Δppl is too noisy to rank methods: it can even improve by chance),
# so they sit at about 2.5x the measured cost, while Δppl only catches gross breakage. A real
# regression (a layer left float by mistake, a wrong scale, activations quantized per tensor where
# they should not be) moves KL by far more than the kernel differences between machines do.
THRESHOLDS = {  # method: (max |Δ ppl| %, min top-1 agreement, max mean KL)
    "dynamic": (0.5, 0.97, 0.0010),
    "static": (1.0, 0.92, 0.0055),
    "weight-only": (0.2, 0.98, 0.0003),
}


@pytest.fixture(scope="module")
def sample_dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("sample")
    export_checkpoint(SAMPLE, base / "fp32")
    calibration = CALIBRATION.read_text(encoding="utf-8")
    for method in THRESHOLDS:
        quantize_model_dir(base / "fp32", base / method, QuantizeRecipe(method), calibration_text=calibration)
    return base


@pytest.fixture(scope="module")
def excerpt_ids(sample_dirs):
    return load(sample_dirs / "fp32", device="cpu").encode(EXCERPT.read_text(encoding="utf-8"))[:EVAL_TOKENS]


def test_export_parity_recorded(sample_dirs):
    parity = json.loads((sample_dirs / "fp32" / "gptedge.json").read_text())["parity"]
    assert parity["graph_vs_reference"]["max_abs_diff"] <= 1e-4
    assert parity["graph_vs_reference"]["top1_agreement"] == 1.0
    assert parity["greedy_vs_reference"]["identical"] and parity["greedy_vs_reference"]["tokens_compared"] >= 150


def test_eval_perplexity_equals_pytorch(sample_dirs, excerpt_ids):
    ref, cfg = load_checkpoint(SAMPLE)
    got = perplexity(load(sample_dirs / "fp32", device="cpu"), excerpt_ids)
    want = reference_perplexity(ref, excerpt_ids, cfg.n_positions)
    assert abs(got.perplexity / want - 1) <= 1e-4, (got.perplexity, want)
    assert 20 < got.perplexity < 400  # a trained model, not a random one (random: ~8192)


def test_int8_methods_within_thresholds(sample_dirs, excerpt_ids):
    models = [load(sample_dirs / m, device="cpu") for m in ("fp32", *THRESHOLDS)]
    rows = compare(models, excerpt_ids, prompts=4, new_tokens=16)
    for method, row in zip(THRESHOLDS, rows[1:], strict=True):
        max_dppl, min_top1, max_kl = THRESHOLDS[method]
        assert row.method == method
        assert abs(row.delta_ppl_pct) <= max_dppl, (method, row)
        assert row.top1_agreement >= min_top1, (method, row)
        assert row.kl <= max_kl, (method, row)
        assert row.size_bytes < 0.4 * rows[0].size_bytes, (method, row)


def test_compare_cli_on_sample(sample_dirs, tmp_path):
    text = tmp_path / "excerpt.txt"
    text.write_text(EXCERPT.read_text(encoding="utf-8")[:12000], encoding="utf-8")
    result = CliRunner().invoke(main, ["compare", str(sample_dirs / "fp32"), str(sample_dirs / "weight-only"),
                                       "--text", str(text), "--prompts", "2", "--new-tokens", "8", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert rows[1]["method"] == "weight-only" and rows[1]["top1_agreement"] > 0.97


def test_greedy_generation_is_readable_and_pinned(sample_dirs):
    model = load(sample_dirs / "fp32", device="cpu")
    out = model.generate("It is a truth universally acknowledged, that", max_new_tokens=24, greedy=True)
    assert out.ids == PINNED_GREEDY_IDS, (out.ids, out.text)
    words = out.text.split()
    assert len(words) >= 12 and sum(w.strip(".,;:!?'\"").isalpha() for w in words) >= 0.8 * len(words)


def test_seeded_sampling_is_pinned(sample_dirs):
    model = load(sample_dirs / "fp32", device="cpu")
    out = model.generate("And the LORD said", max_new_tokens=16, top_k=40, temperature=0.8, seed=0)
    assert out.ids == PINNED_SAMPLED_IDS, (out.ids, out.text)


def test_generate_without_model_uses_the_sample(tmp_path, monkeypatch):
    monkeypatch.setenv("GPTEDGE_CACHE", str(tmp_path))
    args = ["generate", "-p", "It is a truth universally acknowledged, that", "-n", "24", "--greedy"]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    assert [p.name for p in tmp_path.iterdir()][0].startswith("sample-model-")  # exported on first use
    again = CliRunner().invoke(main, args)
    assert again.stdout == first.stdout and "exporting the sample model" not in again.stderr


# "\nand the very much of the world, and the world,\nand the world, and the world, and the" (a small model's
# greedy loop: readable words, repeated)
PINNED_GREEDY_IDS = [199, 376, 260, 506, 631, 271, 260, 1084, 12, 270, 260, 1084, 12, 199, 376, 260, 1084, 12,
                     270, 260, 1084, 12, 270, 260]
# " unto the LORD, Thus saith the LORD, Ye will the God of Israel,"
PINNED_SAMPLED_IDS = [365, 260, 394, 12, 2165, 758, 260, 394, 12, 2653, 411, 260, 457, 271, 551, 12]
