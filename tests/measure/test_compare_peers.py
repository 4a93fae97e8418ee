"""compare --peers: CTranslate2 and Optimum quantize the same checkpoint their own way and are scored on the
same windows against the same fp32 reference; the frontier (who dominates whom) and its chart.

The oracles: PyTorch's reference GPT for the reference logits and each engine's own API (CTranslate2's
converter + Generator, generate_batch) for the peer's, with the KL, top-1 and perplexity formulas written
out here in torch. llama.cpp's peer is in test_peer_llama_cpp.py (skipped where llama_cpp is absent).
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from gptedge.cli import main
from gptedge.measure.compare import CompareRow, compare
from gptedge.measure.frontier import dominates, dominators, pareto_front
from gptedge.measure.peers.base import Greedy, decode_rate, timed_greedy
from gptedge.measure.peers.score import open_peers, unavailable

from ..support.checkpoints import EXCERPT, tiny_reference, write_checkpoint

RECIPES = {"ctranslate2": ("float32", "int8", "int8_float32"), "optimum": ("fp32", "int8")}


@pytest.fixture(scope="module")
def text_ids(gpt2_loaded):
    return gpt2_loaded.encode(EXCERPT.read_text(encoding="utf-8")[:3000])  # 750 tokens: 11 windows of 128


@pytest.fixture(scope="module")
def peer_run(gpt2_loaded, gpt2_checkpoint, gpt2_model_dir, text_ids):
    """One compare of the fp32 dir with CTranslate2 (float32, int8, int8_float32) and Optimum (fp32, int8)."""
    with open_peers(["ctranslate2", "optimum"], gpt2_checkpoint, gpt2_model_dir, threads=2, recipes=RECIPES) as (
            scorers, skipped):
        rows = compare([gpt2_loaded], text_ids, prompts=3, new_tokens=8, peers=scorers)
        yield {r.model: r for r in rows}, {s.info.name: s for s in scorers}, skipped


@pytest.mark.interop  # CTranslate2 and Optimum run here (the test extra)
def test_rows_for_every_peer_recipe_one_per_ctranslate2_compute_type(peer_run):
    rows, _, skipped = peer_run
    assert skipped == []
    names = list(rows)[1:]
    # On CPU CTranslate2 runs "int8" as int8_float32: one engine configuration, one row named by both.
    assert names == ["ctranslate2 float32", "ctranslate2 int8 (= int8_float32)", "optimum fp32", "optimum int8"]
    for name in names:
        r = rows[name]
        assert r.peer and r.engine.split()[0] in ("ctranslate2", "optimum-onnx") and r.tokens_per_s > 0
    assert rows["ctranslate2 int8 (= int8_float32)"].method == "CTranslate2 int8_float32"
    assert not next(iter(rows.values())).peer


@pytest.mark.interop  # CTranslate2 and Optimum run here (the test extra)
def test_peers_fed_fp32_weights_agree_with_the_reference(peer_run):
    rows, _, _ = peer_run
    ref = next(iter(rows.values()))
    for name in ("ctranslate2 float32", "optimum fp32"):
        r = rows[name]
        assert 0 <= r.kl < 1e-9 and r.top1_agreement == 1.0 and r.greedy_agreement == 1.0, r
        assert abs(r.perplexity / ref.perplexity - 1) < 1e-6 and r.precision == "fp32"


@pytest.mark.interop  # CTranslate2 and Optimum run here (the test extra)
def test_int8_peers_differ_from_fp32_by_a_small_finite_kl(peer_run):
    rows, scorers, _ = peer_run
    for name, fp32 in (("ctranslate2 int8 (= int8_float32)", "ctranslate2 float32"), ("optimum int8", "optimum fp32")):
        r = rows[name]
        assert math.isfinite(r.kl) and 1e-7 < r.kl < 1e-3, r
        assert 0.5 < r.top1_agreement < 1.0 and r.precision == "int8"
        assert r.size_bytes < 0.4 * rows[fp32].size_bytes
        ids = np.arange(100, 164, dtype=np.int64)
        assert np.abs(scorers[name].logits(ids) - scorers[fp32].logits(ids)).max() > 1e-3


@pytest.mark.interop  # CTranslate2 and Optimum run here (the test extra)
def test_peer_figures_against_an_independent_oracle(peer_run, gpt2_checkpoint, gpt2_model_dir, text_ids, tmp_path):
    """KL(ref‖q), top-1 and perplexity of CTranslate2 int8, recomputed from PyTorch's reference and a CTranslate2
    model converted here; tight enough to tell KL(ref‖q) from KL(q‖ref)."""
    import shutil

    import ctranslate2
    import torch

    from gptedge.export.checkpoint import load_checkpoint

    ck = tmp_path / "ck"
    shutil.copytree(gpt2_checkpoint, ck)
    shutil.copyfile(gpt2_model_dir / "tokenizer.json", ck / "tokenizer.json")
    ctranslate2.converters.TransformersConverter(str(ck)).convert(str(tmp_path / "ct2"), quantization="int8")
    engine = ctranslate2.Generator(str(tmp_path / "ct2"), device="cpu", compute_type="int8")
    model, _ = load_checkpoint(gpt2_checkpoint)
    forward = backward = agree = nll = 0.0
    n, context, begin, scored = 0, 128, 0, 1
    while scored < len(text_ids):  # windows of 128 keeping 64 tokens of history, every target once
        end = min(begin + context, len(text_ids))
        x, first = text_ids[begin:end], scored - begin
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([x]))[0][0].double(), -1)[first - 1:-1]
        lq = torch.log_softmax(torch.tensor(np.asarray(engine.forward_batch([x]))[0]).double(), -1)[first - 1:-1]
        targets = torch.tensor(text_ids[scored:end])
        forward += (lp.exp() * (lp - lq)).sum().item()
        backward += (lq.exp() * (lq - lp)).sum().item()
        agree += (lp.argmax(-1) == lq.argmax(-1)).sum().item()
        nll -= lq.gather(1, targets[:, None]).sum().item()
        n += len(targets)
        scored, begin = end, max(0, min(end - context + context // 2, end - 1))
    row = peer_run[0]["ctranslate2 int8 (= int8_float32)"]
    assert n == len(text_ids) - 1
    assert abs(row.kl / (forward / n) - 1) < 1e-5, (row.kl, forward / n, backward / n)
    # Which direction: CTranslate2's int8 error depends on the CPU (on AVX512-VNNI its KL is ~5e-7 and the two
    # directions differ by less than the oracle's own PyTorch-vs-ONNX noise), so the direction is judged only where
    # the two differ by more than 5x the match tolerance; then compare's KL must be the forward one.
    if abs(backward / forward - 1) > 5e-5:
        assert abs(row.kl - forward / n) < abs(backward - forward) / n / 5, (row.kl, forward / n, backward / n)
    assert row.top1_agreement == pytest.approx(agree / n, abs=1e-12)
    assert row.perplexity == pytest.approx(math.exp(nll / n), rel=1e-6)
    prompt = text_ids[40:72]
    want = engine.generate_batch([[engine_token(gpt2_model_dir, i) for i in prompt]], max_length=8, sampling_topk=1,
                                 include_prompt_in_result=False)[0].sequences_ids[0]
    assert peer_run[1]["ctranslate2 int8 (= int8_float32)"].greedy(prompt, 8, 50256).ids == want


def engine_token(model_dir, i: int) -> str:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(model_dir / "tokenizer.json")).id_to_token(i)


@pytest.mark.interop  # CTranslate2 and Optimum run here (the test extra)
def test_optimum_fp32_greedy_equals_gptedge(peer_run, gpt2_loaded, text_ids):
    """Optimum's own generate on its fp32 export, through the peer, against gptedge's fp32 (itself checked
    against PyTorch): the same ids, and a greedy continuation that stops where eos is."""
    scorer = peer_run[1]["optimum fp32"]
    for start in (0, 300, 600):
        prompt = text_ids[start:start + 24]
        got = scorer.greedy(prompt, 12, gpt2_loaded.manifest.eos_id)
        assert got.ids == gpt2_loaded.generate(prompt, max_new_tokens=12, greedy=True).ids and got.tokens_per_s > 0


@pytest.mark.interop  # CTranslate2 and Optimum run here (the test extra)
def test_dominated_by_matches_a_brute_force_reading(peer_run):
    rows = list(peer_run[0].values())
    for r in rows:
        want = [o.model for o in rows if o is not r and o.kl <= r.kl and o.tokens_per_s >= r.tokens_per_s
                and (o.kl < r.kl or o.tokens_per_s > r.tokens_per_s)]
        assert r.dominated_by == want, r


def test_frontier_dominance_and_front():
    pts = [(0.0, 100.0), (0.001, 200.0), (0.002, 150.0), (0.0005, 200.0), (0.01, 300.0), (0.01, 300.0)]
    assert dominates(pts[3], pts[1]) and not dominates(pts[1], pts[3]) and not dominates(pts[4], pts[5])
    assert dominators(pts) == [[], [3], [1, 3], [], [], []]
    assert pareto_front(pts) == [4, 5, 3, 0]  # fastest first; equal points are both on the front


def test_timed_greedy_stops_and_rates_as_generation(monkeypatch):
    import gptedge.measure.peers.base as cmp

    clock = iter([10.0, 12.0])  # read after the first token, then after the last
    monkeypatch.setattr(cmp.time, "perf_counter", lambda: next(clock))
    drawn = []

    def stream():
        for t in (5, 6, 7, 8, 9):
            drawn.append(t)
            yield t

    got = timed_greedy(stream(), 10, eos_id=8)  # stops after eos, which it keeps
    assert got == Greedy([5, 6, 7, 8], 3 / (12.0 - 10.0)) and drawn == [5, 6, 7, 8]
    clock = iter([0.0, 4.0])
    monkeypatch.setattr(cmp.time, "perf_counter", lambda: next(clock))
    assert timed_greedy(iter([1, 2, 3, 4]), 3, eos_id=None) == Greedy([1, 2, 3], 0.5)  # 2 tokens in 4 s
    assert decode_rate(1, 0.0, 1.0) == 0.0 and decode_rate(5, 1.0, 3.0) == 2.0


def _row(model: str, kl: float, tps: float, peer: bool = False) -> CompareRow:
    return CompareRow(model, "int8", "m", 1_000_000, 10.0, 0.0, 0.9, kl, 1.0, tps, peer=peer)


def test_frontier_panel_fills_the_front_and_draws_its_steps():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gptedge.measure.plot import plot_frontier

    rows = [_row("/x/fp32", 0.0, 100.0), _row("/x/a", 0.001, 200.0), _row("p q", 0.002, 150.0, peer=True),
            _row("/x/b", 0.0005, 180.0), _row("r s", 0.01, 300.0, peer=True)]
    fig, ax = plt.subplots()
    plot_frontier(ax, rows)
    marks = ax.collections  # one scatter per row with KL > 0, in row order
    assert len(marks) == 4
    filled = [len(m.get_facecolors()) > 0 and m.get_facecolors()[0][3] > 0 for m in marks]  # 'none': no face
    assert filled == [True, False, True, True]  # "p q" is dominated by a (and b): hollow
    assert [m.get_paths()[0].vertices.shape[0] != marks[0].get_paths()[0].vertices.shape[0] for m in marks] == [
        False, True, False, True]  # squares for peers, circles for gptedge rows
    step = next(line for line in ax.get_lines() if line.get_label() == "Pareto front")
    assert sorted(set(step.get_xdata())) == [180.0, 200.0, 300.0] and ax.get_yscale() == "log"
    ref = next(line for line in ax.get_lines() if "KL 0" in line.get_label())
    assert list(ref.get_xdata()) == [100.0, 100.0]
    plt.close(fig)


@pytest.mark.interop  # CTranslate2 and Optimum run here (the test extra)
def test_compare_cli_peers_json_markdown_plot(gpt2_model_dir, tmp_path):
    """The CLI with --peers and the checkpoint from REF's manifest: peer rows in the JSON, the table and the chart."""
    text = tmp_path / "t.txt"
    text.write_text(EXCERPT.read_text(encoding="utf-8")[:2000], encoding="utf-8")
    args = ["compare", str(gpt2_model_dir), "--text", str(text), "--prompts", "2", "--new-tokens", "6",
            "--peers", "ctranslate2,optimum", "--threads", "1"]
    result = CliRunner().invoke(main, [*args, "--json", "--markdown", str(tmp_path / "c.md"), "--plot",
                                       str(tmp_path / "c.png")])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [(r["model"], r["peer"]) for r in rows[1:]] == [("ctranslate2 int8 (= int8_float32)", True),
                                                           ("optimum int8", True)]
    assert rows[0]["engine"] == "gptedge" and all(0 < r["kl"] < 1e-3 for r in rows[1:])
    assert "peer ctranslate2 int8: converting" in result.stderr
    table = (tmp_path / "c.md").read_text(encoding="utf-8")
    assert "| ctranslate2 int8 (= int8_float32) | CTranslate2 int8_float32 |" in table
    assert "| peer: optimum-onnx " in table
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.interop  # CTranslate2 and Optimum run here (the test extra)
def test_compare_cli_source_is_the_peers_checkpoint(gpt2_model_dir, tmp_path):
    """--source replaces the manifest's checkpoint: another seed's weights, so a KL far from the int8 figure."""
    other = write_checkpoint(tiny_reference("gpt2", seed=7), tmp_path / "other")
    text = tmp_path / "t.txt"
    text.write_text(EXCERPT.read_text(encoding="utf-8")[:1200], encoding="utf-8")
    base = ["compare", str(gpt2_model_dir), "--text", str(text), "--prompts", "1", "--new-tokens", "4", "--json",
            "--peers", "ctranslate2"]
    own = json.loads(CliRunner().invoke(main, base).stdout)[1]
    result = CliRunner().invoke(main, [*base, "--source", str(other)])
    assert result.exit_code == 0, result.output
    swapped = json.loads(result.stdout)[1]
    assert own["kl"] < 1e-3 < 0.01 < swapped["kl"], (own["kl"], swapped["kl"])


def test_a_peer_not_installed_is_skipped_with_its_install_hint(gpt2_model_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp raises ImportError
    text = tmp_path / "t.txt"
    text.write_text(EXCERPT.read_text(encoding="utf-8")[:600], encoding="utf-8")
    result = CliRunner().invoke(main, ["compare", str(gpt2_model_dir), "--text", str(text), "--prompts", "1",
                                       "--new-tokens", "2", "--json", "--peers", "llama.cpp"])
    assert result.exit_code == 0, result.output
    assert ("peer llama.cpp skipped: llama_cpp is not installed: CMAKE_BUILD_PARALLEL_LEVEL=2 pip install "
            "llama-cpp-python==0.3.36") in result.stderr
    assert [r["model"] for r in json.loads(result.stdout)] == [str(gpt2_model_dir)]
    monkeypatch.setitem(sys.modules, "ctranslate2", None)
    assert unavailable("ctranslate2").startswith("ctranslate2 is not installed: pip install ctranslate2")
