"""Beam search's options where they matter: a model peaked enough that every beam finishes early, so
early_stopping True, False and "never" part ways, each against transformers' generate(num_beams=...) as the README
promises; and each option's refusal. tests/generation/test_beam_search.py covers the near-uniform tiny model."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pytest

from gptedge.runtime import load
from gptedge.runtime.errors import InvalidArgumentError
from gptedge.runtime.generation.beam_search import BeamOptions

from ..support.checkpoints import built_once, tiny_reference, write_checkpoint
from ..support.beams import assert_same, transformers_beams

EOS = 1
PROMPTS = [[3, 4, 5], [7]]


def peaked_model(out: Path) -> Path:
    """16 tokens, the tied embedding x10: next-token distributions peaked enough that the end-of-text token wins
    early in some beams (seed 2: all of prompt 0's finish by length 3)."""
    import torch

    from gptedge.export.exporter import export_model

    ref = tiny_reference("gpt2", seed=2, vocab_size=16, n_positions=64, bos_token_id=0, eos_token_id=EOS)
    with torch.no_grad():
        ref.wte.weight.mul_(10.0)
    write_checkpoint(ref, out / "ck", tokenizer=False)
    for graph in ("standard", "kv_buffer"):
        export_model(ref, out / graph, validate=False, graph_variant=graph)
    return out


@pytest.fixture(scope="module")
def peaked(tmp_path_factory) -> Path:
    return built_once(tmp_path_factory, "beams-peaked", peaked_model)


@functools.lru_cache(maxsize=None)
def expected(checkpoint: Path, length_penalty, early_stopping):
    """transformers' beams, once per option set (both graphs must match them)."""
    return transformers_beams(checkpoint, PROMPTS, 10, eos=EOS, pad=EOS, num_beams=3, length_penalty=length_penalty,
                              early_stopping=early_stopping, num_return_sequences=3)


@pytest.mark.interop
@pytest.mark.parametrize("graph", ["standard", "kv_buffer"])
@pytest.mark.parametrize("length_penalty", [1.0, 2.0, 0.5])
@pytest.mark.parametrize("early_stopping", [True, False, "never"])
def test_every_beam_finishing_early_equals_transformers(peaked, graph, length_penalty, early_stopping):
    model = load(peaked / graph, device="cpu")
    options = dict(num_beams=3, length_penalty=length_penalty, early_stopping=early_stopping, num_return_sequences=3)
    ours = model.beam_search(PROMPTS, max_new_tokens=10, **options)
    assert_same(ours, expected(peaked / "ck", length_penalty, early_stopping))
    if early_stopping is True:  # the case reached: num_beams hypotheses done long before max_new_tokens
        assert all(s[-1] == EOS and len(s) <= 3 for s in ours[0].sequences)
    else:  # ... and searching on finds longer, better ones
        assert all(len(s) == 10 for s in ours[0].sequences)


@pytest.mark.interop
@pytest.mark.parametrize("graph", ["standard", "kv_buffer"])
def test_three_prompts_keep_their_own_beams(peaked, graph):
    """Each prompt's beams gather their own cache rows (with two prompts a wrong row offset can wrap around)."""
    prompts = [[3, 4, 5], [7], [9, 2]]
    options = dict(num_beams=3, length_penalty=1.0, early_stopping=False, num_return_sequences=2)
    ours = load(peaked / graph, device="cpu").beam_search(prompts, max_new_tokens=8, **options)
    assert_same(ours, transformers_beams(peaked / "ck", prompts, 8, eos=EOS, pad=EOS, **options))


@pytest.mark.parametrize("graph", ["standard", "kv_buffer"])
def test_a_chunked_prefill_gives_the_same_beams(peaked, graph):
    """The prefill chunk is chosen for the whole batch of beams (kv_buffer: one run when there are several rows)."""
    model = load(peaked / graph, device="cpu")
    prompts = [list(range(2, 16)), [7, 3], [5] * 9]  # 3 prompts x 3 beams
    whole = model.beam_search(prompts, max_new_tokens=6, num_beams=3, prefill_chunk=None)
    assert model.beam_search(prompts, max_new_tokens=6, num_beams=3, prefill_chunk=4) == whole


def test_return_sequences_are_the_best_first_with_their_scores(peaked):
    model = load(peaked / "standard", device="cpu")
    three = model.beam_search(PROMPTS, max_new_tokens=10, num_beams=3, early_stopping=True, num_return_sequences=3)
    one = model.beam_search(PROMPTS, max_new_tokens=10, num_beams=3, early_stopping=True, num_return_sequences=1)
    for a, b in zip(three, one, strict=True):
        assert a.scores == sorted(a.scores,
                                  reverse=True) and b.sequences == a.sequences[:1] and b.scores == a.scores[:1]
        assert a.prompt_ids in PROMPTS and a.texts is None  # no tokenizer in this dir: no texts


def test_beams_stay_inside_the_context(peaked):
    model = load(peaked / "standard", device="cpu")
    prompt = list(range(2, 16)) * 4 + [3, 4, 5]  # 59 of 64 positions
    r = model.beam_search([prompt], max_new_tokens=20, num_beams=2, early_stopping="never")[0]
    assert r.sequences and all(len(s) <= 64 - len(prompt) for s in r.sequences)


@pytest.mark.parametrize("options, says", [
    (dict(num_beams=0), "num_beams must be an integer >= 1, got 0"), (dict(num_beams=2.0), "num_beams must be"),
    (dict(num_beams=2, num_return_sequences=0), "num_return_sequences must be in 1..num_beams \\(2\\), got 0"),
    (dict(num_beams=2, num_return_sequences=3), "num_return_sequences must be in 1..num_beams \\(2\\), got 3$"),
    (dict(num_return_sequences=1.0), "num_return_sequences"),
    (dict(early_stopping="always"), "early_stopping must be true, false or 'never', got 'always'"),
    (dict(early_stopping=None), "early_stopping"),
    (dict(length_penalty=float("nan")), "length_penalty must be a finite number"),
    (dict(length_penalty=float("inf")), "length_penalty"), (dict(length_penalty="1"), "length_penalty"),
])
def test_each_beam_option_is_checked(options, says):
    with pytest.raises(InvalidArgumentError, match="^" + says):
        BeamOptions(**options)


def test_edge_options_pass():
    for options in (dict(num_beams=1), dict(num_beams=3, num_return_sequences=3), dict(length_penalty=0),
                    dict(length_penalty=-1.5), dict(early_stopping="never"), dict(early_stopping=True)):
        BeamOptions(**options)
    assert BeamOptions() == BeamOptions(4, 1.0, False, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        BeamOptions().num_beams = 2
