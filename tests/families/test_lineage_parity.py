"""The parity ladder on GPT-2's descendants, every rung against transformers' own model on tiny seeded
checkpoints it wrote (tests/support/lineage_checkpoints.py): the Llama-style family (export/llama.py: GQA ratios 1, 2,
4, rope scalings none / linear / llama3, tied and untied heads, biases on and off) and GPT-NeoX
(export/gpt_neox.py: partial rotary, parallel and sequential residual, tied and untied).

1. reference vs transformers: logits of a left-padded batch <= 1e-5;
2. the reference's KV cache vs recomputing the whole sequence <= 1e-5;
3. each ONNX graph (standard, kv_buffer) vs the reference: a left-padded prefill and decode steps, logits
   and every present.* (the cache holds the kv heads only) <= 1e-4;
4. greedy ids of the runtime identical to transformers' generate, alone and in a left-padded batch.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gptedge import runtime
from gptedge.export.checkpoint import load_checkpoint
from gptedge.export.exporter import export_checkpoint
from gptedge.runtime.generation.generation import positions

from ..support.lineage_checkpoints import VARIANTS, VOCAB, variant_model, write_variant_checkpoint
from ..support.beams import assert_same, transformers_beams

pytestmark = pytest.mark.slow  # transformers' own Llama-style and GPT-NeoX models on every rung

GRAPHS = ("standard", "kv_buffer")
PROMPTS = ([5, 77, 140, 9, 300], [12], [200, 3, 3, 45, 61, 99, 250, 17, 8])


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("lineage")
    return {v: write_variant_checkpoint(root / v, v, tokenizer=False) for v in VARIANTS}


@pytest.fixture(scope="module")
def exported(checkpoints, tmp_path_factory):
    """(variant, graph) -> the loaded model dir, exported without export's own validation: these tests are it."""
    root = tmp_path_factory.mktemp("lineage_onnx")
    loaded = {}
    for v in VARIANTS:
        for g in GRAPHS:
            export_checkpoint(checkpoints[v], root / f"{v}-{g}", graph_variant=g, validate=False)
            loaded[v, g] = runtime.load(root / f"{v}-{g}", device="cpu")
    return loaded


def padded_batch(seed: int = 0, lengths=(9, 6, 3)) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    width = max(lengths)
    ids = np.zeros((len(lengths), width), np.int64)
    mask = np.zeros_like(ids)
    for b, n in enumerate(lengths):
        ids[b, width - n:] = rng.integers(3, VOCAB, n)
        mask[b, width - n:] = 1
    return ids, mask


def transformers_model(variant: str):
    return variant_model(variant)


@pytest.mark.parametrize("variant", VARIANTS)
def test_rung1_reference_matches_transformers(checkpoints, variant):
    hf = transformers_model(variant)
    reference, cfg = load_checkpoint(checkpoints[variant])
    assert cfg.kv_heads == getattr(hf.config, "num_key_value_heads", hf.config.num_attention_heads)
    assert cfg.tied_head == hf.config.tie_word_embeddings
    ids, mask = padded_batch()
    pos = positions(mask)
    with torch.no_grad():
        want = hf(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                  position_ids=torch.from_numpy(pos)).logits
        got, _ = reference(torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(pos))
    valid = torch.from_numpy(mask).bool()
    assert (want[valid] - got[valid]).abs().max().item() <= 1e-5


@pytest.mark.parametrize("variant", VARIANTS)
def test_rung2_reference_cache_matches_recompute(checkpoints, variant):
    reference, _ = load_checkpoint(checkpoints[variant])
    ids, mask = padded_batch(1)
    full, _ = reference(torch.from_numpy(ids), torch.from_numpy(mask))
    split = 4  # prefill the first 4 columns (row 2 all padding there), then one position a step
    with torch.no_grad():
        logits, past = reference(torch.from_numpy(ids[:, :split]), torch.from_numpy(mask[:, :split]))
        steps = [logits]
        for t in range(split, ids.shape[1]):
            m = torch.from_numpy(mask[:, :t + 1])
            pos = torch.from_numpy(positions(mask[:, :t + 1])[:, -1:])
            logits, past = reference(torch.from_numpy(ids[:, t:t + 1]), m, pos, past)
            steps.append(logits)
    assert past[0][0].shape[1] == reference.cfg.kv_heads  # the cache holds the kv heads only
    cached = torch.cat(steps, dim=1)
    valid = torch.from_numpy(mask).bool()
    assert (cached[valid] - full.detach()[valid]).abs().max().item() <= 1e-5


@pytest.mark.parametrize("graph", GRAPHS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_rung3_graph_matches_reference(checkpoints, exported, variant, graph):
    reference, cfg = load_checkpoint(checkpoints[variant])
    loaded = exported[variant, graph]
    assert loaded.manifest.shape.kv_heads == cfg.kv_heads
    ids, mask = padded_batch(2)
    rng = np.random.default_rng(3)
    past, ref_past, worst = loaded.empty_past(3), None, 0.0
    for _ in range(4):  # the prefill, then 3 decode steps
        pos = positions(mask)[:, -ids.shape[1]:]
        with torch.no_grad():
            want, ref_past = reference(torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(pos), ref_past)
        got, past = loaded.forward(ids, mask, pos, past)
        valid = mask[:, -ids.shape[1]:].astype(bool)
        worst = max(worst, float(np.abs(got - want.numpy())[valid].max()))
        keys = mask.astype(bool)  # (B, T): padding positions of the cache are compared nowhere
        for (k, v), pk, pv in zip(ref_past, past[0::2], past[1::2], strict=True):
            assert pk.shape == tuple(k.shape) and pk.shape[1] == cfg.kv_heads
            for a, b in ((k, pk), (v, pv)):
                worst = max(worst, float(np.abs(a.numpy() - b).transpose(0, 2, 1, 3)[keys].max()))
        ids = rng.integers(3, VOCAB, (3, 1))
        mask = np.concatenate([mask, np.ones((3, 1), np.int64)], axis=1)
    assert worst <= 1e-4


@pytest.mark.parametrize("graph", GRAPHS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_rung4_greedy_matches_transformers_generate(exported, variant, graph):
    hf = transformers_model(variant)
    loaded = exported[variant, graph]
    want = []
    for prompt in PROMPTS:
        out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          do_sample=False, max_new_tokens=24, pad_token_id=2)
        want.append(out[0, len(prompt):].tolist())
        assert loaded.generate(prompt, max_new_tokens=24, greedy=True).ids == want[-1]
    # a left-padded batch: every row as alone
    assert [g.ids for g in loaded.generate_batch(list(PROMPTS), max_new_tokens=24, greedy=True)] == want


@pytest.mark.parametrize("graph", GRAPHS)
@pytest.mark.parametrize("variant", ["gqa4-llama3", "neox-sequential-tied", "gemma-mqa"])
def test_beams_equal_transformers(checkpoints, exported, variant, graph):
    """Beam search over a left-padded batch: sequences and scores as transformers' generate(num_beams=4)."""
    prompts = [PROMPTS[0], PROMPTS[2]]
    options = dict(num_beams=4, length_penalty=1.0, early_stopping=False, num_return_sequences=2)
    want = transformers_beams(checkpoints[variant], prompts, 12, eos=2, pad=2, **options)
    assert_same(exported[variant, graph].beam_search(prompts, 12, **options), want)


@pytest.mark.parametrize("opset", [18, 21])
@pytest.mark.parametrize("graph", GRAPHS)
def test_later_opsets_export_each_family(checkpoints, tmp_path, graph, opset):
    """Ops whose signature changed after opset 17 (ReduceMean's axes became an input at 18: the plain-op RMSNorm)
    are written in the opset asked for: every family exports at 18 and 21 (export validates against the reference)."""
    for v in ("gqa2-linear", "neox-parallel", "gemma-mqa"):
        export_checkpoint(checkpoints[v], tmp_path / f"{v}-{graph}-{opset}", graph_variant=graph, opset=opset)
