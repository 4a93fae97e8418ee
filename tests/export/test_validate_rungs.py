"""Export validation's rungs 3 and 4 given graphs that disagree: a difference between the tolerance
(1e-4) and 1e-1 fails rung 3, one below it passes and is reported where it is, padding is compared nowhere; greedy
ids that differ anywhere fail rung 4, and export itself runs both. The "graph" here is the reference's own outputs
(computed by the PyTorch reference, not by gptedge's runtime) with one value moved."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from gptedge.export.validate import (GRAPH_TOLERANCE, compare_graph_outputs, compare_greedy_ids, graph_steps,
                                     greedy_prompts, reference_outputs)
from gptedge.runtime.errors import ParityError
from gptedge.runtime.modeldir.manifest import GraphParity, GreedyParity

from ..support.checkpoints import tiny_config, tiny_reference


@pytest.fixture(scope="module")
def recorded():
    ref = tiny_reference("gpt2", seed=21)
    steps = graph_steps(ref.cfg, batch=3, prompt_len=6, decode_steps=3, seed=4)
    return steps, reference_outputs(ref, steps)


class Replay:
    """A 'graph' that answers each step with the recorded outputs, one value shifted by `delta` at (step, output
    index in [logits, present.0.key, present.0.value, ...], position)."""

    def __init__(self, expected, step=None, output=0, where=(), delta=0.0, shape=None):
        self.expected, self.step, self.output = expected, step, output
        self.where, self.delta, self.shape = where, delta, shape
        self.calls = 0

    def empty_past(self, batch):
        return []

    def forward(self, ids, mask, pos, past):
        logits, presents = self.expected[self.calls]
        outs = [logits.copy()] + [p.copy() for p in presents]
        if self.calls == self.step:
            outs[self.output][self.where] += self.delta
            if self.shape is not None:
                outs[self.output] = outs[self.output][..., :-1]
        self.calls += 1
        return outs[0], outs[1:]


def test_the_tolerance_is_1e_4():
    assert GRAPH_TOLERANCE == 1e-4  # rung 3 of docs/design.md#the-parity-ladder


def test_identical_outputs_pass_with_their_figures(recorded):
    steps, expected = recorded
    f = compare_graph_outputs(expected, Replay(expected), steps)
    assert f == GraphParity(max_abs_diff=0.0, output="logits", step="prefill", index=(), top1_agreement=1.0,
                            tolerance=1e-4, batch=3, prompt_tokens=6, decode_steps=3)


@pytest.mark.parametrize("delta", [2e-4, 1e-3, 1e-2, 0.05, -0.09])
def test_a_difference_between_the_tolerance_and_1e_1_fails(recorded, delta):
    steps, expected = recorded
    with pytest.raises(ParityError, match=r"^graph vs reference: max \|diff\| \S+ > 1e-04 in logits at decode 2 "
                                          r"index \[1, 0, 5\]; top-1 agreement \d+\.\d+%$"):
        compare_graph_outputs(expected, Replay(expected, step=2, where=(1, 0, 5), delta=delta), steps)


def test_a_difference_below_the_tolerance_passes_and_is_reported_where_it_is(recorded):
    steps, expected = recorded
    f = compare_graph_outputs(expected, Replay(expected, step=1, output=4, where=(2, 1, 6, 3), delta=6e-5), steps)
    assert f.output == "present.1.value" and f.step == "decode 1" and f.index == (2, 1, 6, 3)
    assert 5.9e-5 < f.max_abs_diff < 6.1e-5 and f.top1_agreement == 1.0
    f = compare_graph_outputs(expected, Replay(expected, step=1, output=4, where=(2, 1, 6, 3), delta=6e-3), steps,
                              tolerance=1e-2)  # a tolerance of the caller's
    assert f.tolerance == 1e-2 and 5.9e-3 < f.max_abs_diff < 6.1e-3


@pytest.mark.parametrize("output, name", [(1, "present.0.key"), (2, "present.0.value"), (3, "present.1.key"),
                                          (4, "present.1.value")])
def test_every_present_is_compared(recorded, output, name):
    steps, expected = recorded
    with pytest.raises(ParityError, match=f"in {name} at prefill index \\[0, 2, 4, 1\\]"):
        compare_graph_outputs(expected, Replay(expected, step=0, output=output, where=(0, 2, 4, 1), delta=3e-3), steps)


def test_left_padding_is_compared_nowhere(recorded):
    steps, expected = recorded
    assert steps[0].mask[2, :2].tolist() == [0, 0] and steps[0].mask[2, 2] == 1  # row 2: padded by 2
    for output, where in ((0, (2, 1, 9)), (1, (2, 0, 1, 0)), (2, (2, 3, 0, 5))):  # padded query / cache positions
        f = compare_graph_outputs(expected, Replay(expected, step=0, output=output, where=where, delta=5.0), steps)
        assert f.max_abs_diff == 0.0
    f = compare_graph_outputs(expected, Replay(expected, step=3, output=1, where=(2, 0, 1, 0), delta=5.0), steps)
    assert f.max_abs_diff == 0.0  # the padded cache positions stay padded in decode steps


def test_top1_agreement_counts_valid_positions(recorded):
    steps, expected = recorded
    logits = expected[0][0]
    other = int(np.argsort(logits[0, 5])[-2])  # row 0's last prompt position: make its runner-up win
    f = compare_graph_outputs(expected, Replay(expected, step=0, where=(0, 5, other), delta=100.0), steps,
                              tolerance=1e3)
    valid = int(steps[0].mask.sum()) + 3 * 3  # prefill positions that are not padding, then 3 decode steps x 3 rows
    assert f.top1_agreement == (valid - 1) / valid
    assert f.output == "logits" and f.index == (0, 5, other)


def test_a_shape_that_differs_fails(recorded):
    steps, expected = recorded
    with pytest.raises(ParityError,
                       match=r"^decode 1: present.0.value has shape \[3, 4, 7, 7\], the reference \[3, 4, 7, 8\]"):
        compare_graph_outputs(expected, Replay(expected, step=1, output=2, shape=True), steps)


def test_graph_steps_are_a_left_padded_prefill_then_decode_steps():
    cfg = tiny_config()
    steps = graph_steps(cfg, batch=3, prompt_len=5, decode_steps=2, seed=1)
    assert [s.ids.shape for s in steps] == [(3, 5), (3, 1), (3, 1)]
    assert steps[0].mask.tolist() == [[1] * 5, [0] + [1] * 4, [0, 0] + [1] * 3]
    assert steps[0].pos.tolist() == [[0, 1, 2, 3, 4], [0, 0, 1, 2, 3], [0, 0, 0, 1, 2]]
    assert steps[2].mask.shape == (3, 7) and steps[2].mask[:, -2:].all()
    assert steps[1].pos.tolist() == [[5], [4], [3]] and steps[2].pos.tolist() == [[6], [5], [4]]
    assert all(((s.ids >= 0) & (s.ids < cfg.vocab_size)).all() for s in steps)
    again = graph_steps(cfg, batch=3, prompt_len=5, decode_steps=2, seed=1)
    assert all((a.ids == b.ids).all() for a, b in zip(steps, again, strict=True))
    short = graph_steps(tiny_config(n_positions=6), batch=2, prompt_len=8, decode_steps=3)
    assert short[0].ids.shape == (2, 2) and short[-1].mask.shape == (2, 5)  # prompt + decode steps < context
    one = graph_steps(cfg, batch=4, prompt_len=2, decode_steps=1)
    assert one[0].mask.tolist() == [[1, 1], [0, 1], [0, 1], [0, 1]]  # every row keeps one real token


@dataclass
class Ids:
    ids: list[int]


class Fixed:
    """A 'graph' whose greedy continuation of prompt j is answers[j]."""

    def __init__(self, answers):
        self.answers, self.calls = answers, []

    def generate(self, prompt, max_new_tokens, **options):
        self.calls.append((prompt, max_new_tokens, options))
        return Ids(list(self.answers[len(self.calls) - 1]))


WANT = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14]]
PROMPTS = [[1], [2, 3]]


def test_identical_greedy_ids_pass_with_their_figures():
    graph = Fixed(WANT)
    f = compare_greedy_ids(WANT, graph, PROMPTS, new_tokens=6)
    assert f == GreedyParity(prompts=2, tokens_compared=10, new_tokens_per_prompt=6, identical=True)
    assert graph.calls == [([1], 6, {"greedy": True}), ([2, 3], 6, {"greedy": True})]
    default = Fixed(WANT)
    assert compare_greedy_ids(WANT, default, PROMPTS).new_tokens_per_prompt == 64  # rung 4's 64 tokens
    assert [c[1] for c in default.calls] == [64, 64]


@pytest.mark.parametrize("answers, says", [
    ([[5, 6, 7, 8], [9, 10, 11, 99, 13, 14]],
     r"at new token 3 of prompt 1 \(reference \[12\], graph \[99\]; 6 vs 6 tokens\)"),
    ([[4, 6, 7, 8], WANT[1]], r"at new token 0 of prompt 0 \(reference \[5\], graph \[4\]; 4 vs 4 tokens\)"),
    ([[5, 6, 7, 8], [9, 10, 11, 12, 13]],
     r"at new token 5 of prompt 1 \(reference \[14\], graph \[\]; 6 vs 5 tokens\)"),
    ([[5, 6, 7, 8, 1], WANT[1]], r"at new token 4 of prompt 0 \(reference \[\], graph \[1\]; 4 vs 5 tokens\)"),
])
def test_greedy_ids_that_differ_anywhere_fail(answers, says):
    with pytest.raises(ParityError, match="^greedy ids differ from the reference " + says + "$"):
        compare_greedy_ids(WANT, Fixed(answers), PROMPTS, new_tokens=6)


def test_the_text_is_compared_too():
    class Drifting:  # decodes the same ids differently each time: the text rung must notice
        n = 0

        def decode(self, ids):
            self.n += 1
            return f"{ids}{self.n}"

    with pytest.raises(ParityError, match="^greedy text differs from the reference for prompt 0$"):
        compare_greedy_ids(WANT, Fixed(WANT), PROMPTS, new_tokens=6, tokenizer=Drifting())


def test_greedy_prompts_come_from_the_tokenizer_when_it_fits_the_vocabulary(gpt2_loaded):
    tok = gpt2_loaded.tokenizer
    prompts = greedy_prompts(50257, tok)
    assert [tok.decode(p) for p in prompts] == ["It is a truth universally acknowledged",
                                                "In the beginning God created",
                                                "Hello world"]
    for fallback in (greedy_prompts(100, tok, seed=2), greedy_prompts(100, None, seed=2)):
        assert [len(p) for p in fallback] == [1, 5, 11] and max(max(p) for p in fallback) < 100
    assert greedy_prompts(100, None, seed=2) == greedy_prompts(100, tok, seed=2) != greedy_prompts(100, None, seed=3)


# -- export runs both rungs --------------------------------------------------------------------------------------
def test_export_fails_when_greedy_ids_disagree_and_writes_nothing(tmp_path, monkeypatch):
    import gptedge.export.exporter as exporter

    real = exporter.reference_greedy

    def off_by_one(reference, prompts, new_tokens=64):  # a reference that disagrees at the 4th token of prompt 2
        ids = real(reference, prompts, new_tokens)
        ids[2][3] = (ids[2][3] + 1) % reference.cfg.vocab_size
        return ids

    monkeypatch.setattr(exporter, "reference_greedy", off_by_one)
    with pytest.raises(ParityError, match="greedy ids differ from the reference at new token 3 of prompt 2"):
        exporter.export_model(tiny_reference("gpt2", seed=3), tmp_path / "m", greedy_tokens=8)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("delta, fails", [(3e-4, True), (3e-5, False)])
def test_export_holds_the_graph_to_1e_4(tmp_path, monkeypatch, delta, fails):
    import gptedge.export.exporter as exporter

    real = exporter.reference_outputs

    def moved(reference, steps):  # the reference moves by delta at one valid logit of the last decode step
        outs = real(reference, steps)
        outs[-1][0][0, 0, 3] += delta
        return outs

    monkeypatch.setattr(exporter, "reference_outputs", moved)
    if fails:
        with pytest.raises(ParityError, match=r"> 1e-04 in logits at decode 3 index \[0, 0, 3\]"):
            exporter.export_model(tiny_reference("gpt2", seed=3), tmp_path / "m", greedy_tokens=8)
        assert list(tmp_path.iterdir()) == []
    else:
        manifest = exporter.export_model(tiny_reference("gpt2", seed=3), tmp_path / "m", greedy_tokens=8)
        graph = manifest.parity.graph_vs_reference
        assert 2e-5 < graph.max_abs_diff < 1e-4 and graph.tolerance == 1e-4
        assert manifest.parity.greedy_vs_reference.identical and manifest.parity.greedy_vs_reference.tokens_compared > 0
