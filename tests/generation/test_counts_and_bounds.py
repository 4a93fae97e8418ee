"""Counts the Python API takes (issue #35): a kv_buffer graph's cache is sized by the context, never by a huge
max_new_tokens (it stops at the context as the standard graph does, both sides of the edge), and a count is an
integer as callers hold one: numpy's integers pass, True (an int to Python) and floats are refused."""

from __future__ import annotations

import numpy as np
import pytest

from gptedge.runtime.errors import InvalidArgumentError
from gptedge.runtime.generation.generation_options import BeamOptions, SamplingParams

CONTEXT = 128  # tests/support/checkpoints.tiny_config's n_positions


def allocations(model, monkeypatch) -> list[int]:
    """Records the max_length of every cache the variant allocates."""
    seen, start = [], model.variant.start

    def spy(batch, max_length):
        seen.append(max_length)
        return start(batch, max_length)
    monkeypatch.setattr(model.variant, "start", spy)
    return seen


def test_a_huge_max_new_tokens_on_kv_buffer_stops_at_the_context(gpt2_kv_buffer_loaded, monkeypatch):
    m = gpt2_kv_buffer_loaded
    seen = allocations(m, monkeypatch)
    r = m.generate([1, 2, 3], max_new_tokens=1_000_000_000, ignore_eos=True)  # was std::bad_alloc
    assert r.stop == "context" and len(r.prompt_ids) + len(r.ids) == CONTEXT
    assert seen == [CONTEXT]


def test_rows_of_different_lengths_both_reach_the_context(gpt2_kv_buffer_loaded, monkeypatch):
    m = gpt2_kv_buffer_loaded
    seen = allocations(m, monkeypatch)
    out = m.generate_batch([[5], list(range(1, 41))], max_new_tokens=10**12, ignore_eos=True)
    assert [(len(g.prompt_ids) + len(g.ids), g.stop) for g in out] == [(CONTEXT, "context")] * 2
    assert seen == [40 + CONTEXT - 1]  # the longest row's padding plus the shortest row's room


@pytest.mark.parametrize("room, stop", [(0, "max_new_tokens"), (1, "context")])
def test_exactly_at_the_context_and_one_past(gpt2_kv_buffer_loaded, room, stop):
    prompt = list(range(1, 101))
    r = gpt2_kv_buffer_loaded.generate(prompt, max_new_tokens=CONTEXT - len(prompt) + room, ignore_eos=True)
    assert (len(r.ids), r.stop) == (CONTEXT - len(prompt), stop)


@pytest.mark.parametrize("call", [
    lambda m: m.generate("Hi", max_new_tokens=True),
    lambda m: m.generate("Hi", max_new_tokens=np.bool_(True)),
    lambda m: m.generate("Hi", max_new_tokens=2.0),
    lambda m: m.generate("Hi", max_new_tokens=2, prefill_chunk=True),
    lambda m: m.beam_search(["Hi"], max_new_tokens=True, num_beams=2),
    lambda m: m.beam_search(["Hi"], max_new_tokens=2, num_beams=2, prefill_chunk=0),
], ids=["generate-True", "generate-np.bool_", "generate-2.0", "prefill_chunk-True", "beam-True", "beam-chunk-0"])
def test_true_and_floats_are_not_counts(gpt2_kv_buffer_loaded, call):
    with pytest.raises(InvalidArgumentError, match="must be an integer >= 1"):
        call(gpt2_kv_buffer_loaded)


def test_numpy_integers_are_counts(gpt2_kv_buffer_loaded):
    m = gpt2_kv_buffer_loaded
    for kind in (np.int64, np.int32, np.uint8):
        r = m.generate([1, 2], max_new_tokens=kind(3), prefill_chunk=kind(1), ignore_eos=True, top_k=kind(2),
                       seed=kind(7))
        assert len(r.ids) == 3 and r.ids == m.generate([1, 2], max_new_tokens=3, ignore_eos=True, top_k=2,
                                                        seed=7).ids
    beams = m.beam_search([[1, 2]], max_new_tokens=np.int64(2), num_beams=np.int64(2),
                          num_return_sequences=np.int64(2))[0]
    assert len(beams.sequences) == 2
    assert type(SamplingParams(top_k=np.int64(3), seed=np.int64(1)).top_k) is int
    assert type(BeamOptions(num_beams=np.int64(3)).num_beams) is int
