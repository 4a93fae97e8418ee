"""GPT-2's descendants through generation and measurement as GPT-2 goes through them: beams as transformers'
beam search, `eval` against transformers' own perplexity, `compare` with the Optimum and CTranslate2 peers,
`bench` with the torch / GenAI / Optimum peers, `info`, `verify`, and ONNX Runtime GenAI's own loop on each dir.
Tiny seeded checkpoints written by transformers (tests/support/lineage_checkpoints.py): Llama with GQA and an untied
head,
Qwen2 with q/k/v biases, GPT-NeoX with partial rotary and parallel residual."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from gptedge import runtime
from gptedge.cli import main
from gptedge.export.exporter import export_checkpoint

from ..support.lineage_checkpoints import variant_model, write_variant_checkpoint
from ..generation.test_beam_search import OPTIONS
from ..support.beams import assert_same, transformers_beams

VARIANTS = ("gqa2-linear", "qwen2-qkv-bias", "neox-parallel")
GRAPHS = ("standard", "kv_buffer")
PROMPTS = [[1, 5, 77, 140, 9, 300], [1, 200, 31]]  # of two lengths: a left-padded batch
TEXT = "hello world, it is the end of the day in the town and the hello is in it"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """(variant, graph) -> model dir, and variant -> its checkpoint."""
    root = tmp_path_factory.mktemp("lineage_measure")
    out = {}
    for variant in VARIANTS:
        out[variant] = write_variant_checkpoint(root / f"ck-{variant}", variant)
        for graph in GRAPHS:
            out[variant, graph] = root / f"{variant}-{graph}"
            export_checkpoint(out[variant], out[variant, graph], graph_variant=graph, validate=False)
    return out


@pytest.mark.interop
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("graph", GRAPHS)
def test_beams_equal_transformers(dirs, variant, graph):
    """Sequences and scores of transformers' generate(num_beams=N) on the same checkpoint, a left-padded batch of 2,
    for each of test_beam_search's option sets (length penalties, early stopping)."""
    model = runtime.load(dirs[variant, graph], device="cpu")
    for options in OPTIONS:
        ours = model.beam_search(PROMPTS, max_new_tokens=12, **options)
        assert_same(ours, transformers_beams(dirs[variant], PROMPTS, 12, eos=2, pad=2, **options))


@pytest.mark.parametrize("variant", VARIANTS)
def test_eval_perplexity_is_transformers(dirs, variant, tmp_path):
    """A text shorter than the context (one window): eval's NLL is transformers' mean NLL of the ids its tokenizer
    gives (bos first where the tokenizer config adds it: the bos is context, not a target)."""
    import torch

    (tmp_path / "t.txt").write_text(TEXT, encoding="utf-8")
    result = CliRunner().invoke(main, ["eval", str(dirs[variant, "kv_buffer"]), "--text", str(tmp_path / "t.txt"),
                                       "--json", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout.strip().splitlines()[-1])
    loaded = runtime.load(dirs[variant, "kv_buffer"], device="cpu")
    ids = loaded.encode_prompt(TEXT)
    if loaded.manifest.add_bos:
        assert ids[0] == loaded.manifest.bos_id and ids[1:] == loaded.encode(TEXT)
    assert got["tokens"] == len(ids) - 1 and len(ids) < 64
    with torch.no_grad():
        logits = variant_model(variant)(torch.tensor([ids])).logits[0, :-1]
    nll = float(torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:])))
    assert abs(got["nll"] - nll) < 1e-4 and abs(got["perplexity"] - math.exp(nll)) < 1e-3 * math.exp(nll)



def test_compare_scores_the_ids_eval_scores(dirs, tmp_path):
    """compare's reference row is eval's perplexity of the same text: both read it as the tokenizer gives it, bos
    first (the Llama variant's tokenizer adds one)."""
    model_dir = str(dirs["gqa2-linear", "kv_buffer"])
    (tmp_path / "t.txt").write_text(TEXT * 4, encoding="utf-8")
    assert runtime.load(model_dir, device="cpu").manifest.add_bos
    said = CliRunner().invoke(main, ["eval", model_dir, "--text", str(tmp_path / "t.txt"), "--json"])
    assert said.exit_code == 0, said.output
    evaluated = json.loads(said.stdout.strip().splitlines()[-1])
    result = CliRunner().invoke(main, ["compare", model_dir, model_dir, "--text", str(tmp_path / "t.txt"),
                                       "--prompts", "1", "--new-tokens", "2", "--prompt-tokens", "4", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.JSONDecoder().raw_decode(result.stdout[result.stdout.index("["):])[0]
    assert abs(rows[0]["perplexity"] / evaluated["perplexity"] - 1) < 1e-9

@pytest.mark.interop
@pytest.mark.parametrize("variant", VARIANTS)
def test_compare_with_optimum_and_ctranslate2_peers(dirs, variant, tmp_path):
    """The peers quantize the reference's own checkpoint (read from its manifest) and are scored on the same windows:
    a finite, small KL and a perplexity near fp32's."""
    (tmp_path / "t.txt").write_text(TEXT * 8, encoding="utf-8")
    result = CliRunner().invoke(main, ["compare", str(dirs[variant, "standard"]), "--text", str(tmp_path / "t.txt"),
                                       "--peers", "optimum,ctranslate2", "--prompts", "2", "--new-tokens", "4",
                                       "--prompt-tokens", "8", "--threads", "1", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.JSONDecoder().raw_decode(result.stdout[result.stdout.index("["):])[0]
    ref, peers = rows[0], {r["model"]: r for r in rows if r.get("peer")}
    assert ref["kl"] == 0 and set(peers) == {"optimum int8", "ctranslate2 int8 (= int8_float32)"}
    for row in peers.values():
        assert 0 < row["kl"] < 0.01 and abs(row["delta_ppl_pct"]) < 5, row


@pytest.mark.interop
@pytest.mark.parametrize("variant", VARIANTS)
def test_bench_info_and_verify(dirs, variant):
    model_dir = str(dirs[variant, "kv_buffer"])
    result = CliRunner().invoke(main, ["bench", model_dir, "--prompt", "8", "--new", "8", "--repeat", "1",
                                       "--threads", "1", "--peers", "torch,genai", "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.JSONDecoder().raw_decode(result.stdout[result.stdout.index("{"):])[0]["rows"]
    assert len(rows) == 3 and all(r["decode_tok_s"] > 0 for r in rows), rows  # gptedge, torch, GenAI
    info = CliRunner().invoke(main, ["info", model_dir, "--device", "cpu"])
    assert info.exit_code == 0, info.output
    got = json.loads(info.stdout)
    assert got["manifest"]["shape"]["arch"] == {"gqa2-linear": "llama", "qwen2-qkv-bias": "qwen2",
                                                "neox-parallel": "gpt_neox"}[variant]
    assert got["genai_ready"] is True
    verified = CliRunner().invoke(main, ["verify", model_dir])
    assert verified.exit_code == 0 and "verified" in verified.output, verified.output


@pytest.mark.interop
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("graph", GRAPHS)
def test_genai_greedy_equals_gptedge(dirs, variant, graph):
    """ONNX Runtime GenAI's own loop on the dir gptedge wrote (its genai_config.json, GenAI's generic decoder: GPT-NeoX
    too, which GenAI's model builder does not take): the ids gptedge generates, prompt by prompt, 24 tokens."""
    pytest.importorskip("onnxruntime_genai")
    from ..export.test_genai import genai_greedy

    model = runtime.load(dirs[variant, graph], device="cpu")
    for prompt in PROMPTS:
        want = model.generate(prompt, max_new_tokens=24, greedy=True).ids
        assert len(set(want)) > 1
        assert genai_greedy(dirs[variant, graph], [prompt], 24, pad=2)[0] == want[:want.index(2) + 1 if 2 in want
                                                                                 else None]


def test_genai_config_names_the_key_value_heads(dirs):
    config = json.loads((dirs["gqa2-linear", "kv_buffer"] / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    assert decoder["num_attention_heads"] == 4 and decoder["num_key_value_heads"] == 2 and decoder["head_size"] == 16
    assert np.all([config["model"]["eos_token_id"] == 2, config["model"]["context_length"] == 64])
