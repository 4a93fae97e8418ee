"""Beam search parity with transformers' generate(num_beams=N): sequences and scores, batch of 2 left-padded."""

from __future__ import annotations


import pytest

from gptedge.runtime import load
from gptedge.runtime.errors import InvalidArgumentError

from ..support.beams import assert_same, transformers_beams
from ..support.checkpoints import ROOT, tiny_reference, write_checkpoint

OPTIONS = [dict(num_beams=4, length_penalty=1.0, early_stopping=False, num_return_sequences=2),
           dict(num_beams=3, length_penalty=0.5, early_stopping=True, num_return_sequences=3),
           dict(num_beams=2, length_penalty=2.0, early_stopping="never", num_return_sequences=1)]


@pytest.fixture(scope="module")
def beam_models(tmp_path_factory):
    """A tiny seeded GPT-2 exported as both graphs, and its checkpoint."""
    from gptedge.export.exporter import export_checkpoint

    base = tmp_path_factory.mktemp("beams")
    ck = write_checkpoint(tiny_reference("gpt2", seed=5), base / "ck")
    for graph in ("standard", "kv_buffer"):
        export_checkpoint(ck, base / graph, graph_variant=graph, validate=False)
    return base


@pytest.mark.interop
@pytest.mark.parametrize("graph", ["standard", "kv_buffer"])
@pytest.mark.parametrize("options", OPTIONS, ids=["default", "early", "never"])
def test_beams_equal_transformers(beam_models, graph, options):
    model = load(beam_models / graph, device="cpu")
    prompts = [[15496, 995, 11, 314], [464, 2068]]
    ours = model.beam_search(prompts, max_new_tokens=20, **options)
    assert_same(ours, transformers_beams(beam_models / "ck", prompts, 20, eos=50256, pad=50256, **options))
    assert all(len(r.sequences) == options["num_return_sequences"] for r in ours)


@pytest.mark.interop
@pytest.mark.parametrize("graph", ["standard", "kv_buffer"])
def test_beams_ending_at_eos_equal_transformers(beam_models, graph):
    """The first step's second-best token is declared the end of text, so hypotheses finish at several
    lengths and compete (length_penalty 0: raw log-probability sums, which favour finishing)."""
    import numpy as np

    model = load(beam_models / graph, device="cpu")
    prompts = [[15496, 995], [464, 2068, 7586, 21831, 18045]]
    ids = np.array([prompts[0]])
    logits, _ = model.forward(ids, np.ones_like(ids), np.arange(2)[None], model.empty_past(1))
    eos = int(np.argsort(-logits[0, -1])[1])
    model.manifest = model.manifest.replace(eos_id=eos)
    options = dict(num_beams=4, length_penalty=0.0, early_stopping=False, num_return_sequences=4)
    ours = model.beam_search(prompts, max_new_tokens=16, **options)
    ended = [len(s) for r in ours for s in r.sequences if s[-1] == eos]
    assert len(set(ended)) >= 3  # eos really ended hypotheses, at several lengths
    assert_same(ours, transformers_beams(beam_models / "ck", prompts, 16, eos=eos, pad=eos, **options))


@pytest.mark.interop
@pytest.mark.slow
def test_beams_on_the_sample_model_equal_transformers(tmp_path):
    from gptedge.export.exporter import export_checkpoint

    sample = ROOT / "samples" / "sample-model"
    export_checkpoint(sample, tmp_path / "kvb", graph_variant="kv_buffer", validate=False)
    model = load(tmp_path / "kvb", device="cpu")
    prompts = [model.encode("It is a truth universally acknowledged, that"), model.encode("Anne")]
    options = dict(num_beams=4, length_penalty=1.0, early_stopping=False, num_return_sequences=2)
    ours = model.beam_search(prompts, max_new_tokens=24, **options)
    eos = model.manifest.eos_id
    assert_same(ours, transformers_beams(sample, prompts, 24, eos=eos, pad=eos, **options))
    assert ours[0].texts[0] == model.decode(ours[0].sequences[0])


def test_one_beam_is_greedy_and_options_are_checked(gpt2_loaded):
    prompt = gpt2_loaded.encode("Hello world")
    assert gpt2_loaded.beam_search([prompt], 12, num_beams=1)[0].sequences[0] == \
        gpt2_loaded.generate(prompt, 12, greedy=True).ids
    with pytest.raises(InvalidArgumentError, match=r"num_return_sequences must be in 1..num_beams \(2\), got 3"):
        gpt2_loaded.beam_search([prompt], 4, num_beams=2, num_return_sequences=3)
    with pytest.raises(TypeError, match="list of prompts"):
        gpt2_loaded.beam_search("Hello", 4)
