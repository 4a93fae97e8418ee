"""The engine's prefill scheduling: newcomers prefilled together under a token budget, and a running row
never waits more than one prefill run of at most the budget between two of its tokens."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest

from gptedge.cli.serve import prefill_budget_for, serve
from gptedge.runtime.generation.generation_options import GPU_PREFILL_BUDGET, PREFILL_CHUNK
from gptedge.runtime.generation.sampling import SamplingParams
from gptedge.runtime.model import LoadedModel
from gptedge.runtime.serving.engine import CompletionRequest, Engine, FinishReason
from ..support.engine import Collector


class RecordingPool:
    """Wraps an engine's pool and records each model run: ("group", k, positions incl. padding),
    ("chunk", 1, positions) or ("step", rows, rows)."""

    def __init__(self, pool, fail_groups: bool = False):
        self.pool, self.runs, self.fail_groups = pool, [], fail_groups
        self.capacity = pool.capacity

    def prefill_group(self, seqs, prompts, **options):  # prefixes (prefix reuse on), keep_all (prompt logprobs)
        if self.fail_groups:
            raise RuntimeError("injected prefill failure")
        self.runs.append(("group", len(seqs), len(seqs) * max(len(p) for p in prompts)))
        return self.pool.prefill_group(seqs, prompts, **options)

    def prefill(self, seq, prompt_ids, chunk, **options):
        runs = self.pool.prefill(seq, prompt_ids, chunk, **options)
        prefix = options.get("prefix")
        done = prefix.shape[2] if prefix is not None else 0
        while True:
            size = min(chunk or len(prompt_ids), len(prompt_ids) - done)
            self.runs.append(("chunk", 1, size))
            done += size
            try:
                next(runs)
            except StopIteration as finished:
                return finished.value
            yield

    def step(self, seqs, tokens):
        self.runs.append(("step", len(seqs), len(seqs)))
        return self.pool.step(seqs, tokens)

    def remove(self, seq):
        self.pool.remove(seq)


def _run(model, requests, budget, max_batch=8, fail_groups=False):
    engine = Engine(model, max_batch=max_batch, max_queue=64, prefill_chunk=budget)
    engine.pool = RecordingPool(engine.pool, fail_groups)
    got = [Collector() for _ in requests]
    for r, c in zip(requests, got, strict=True):  # all queued before the engine starts: one burst
        engine.submit(r, c)
    engine.start()
    for c in got:
        assert c.finished()
    engine.stop(grace_s=1)
    return got, engine.pool.runs


def test_the_prefill_budget_is_one_concept_with_one_default():
    """generate's prefill_chunk, the engine's, and `gptedge serve --prefill-budget` on the CPU are one setting: one
    default. Where the pool shares launch-bound prefill runs on a GPU serve's default is the GPU's; given, it is what
    was given; a variant without the property (the standard graph) gets the CPU's."""
    budget = next(p for p in serve.params if p.name == "prefill_budget")
    assert budget.default is None  # resolved once the model is loaded: where it runs decides
    cpu, cuda = (SimpleNamespace(variant=SimpleNamespace(shares_device_prefills=s)) for s in (False, True))
    defaults = {prefill_budget_for(cpu, None), inspect.signature(Engine).parameters["prefill_chunk"].default,
                *(inspect.signature(getattr(LoadedModel, m)).parameters["prefill_chunk"].default
                  for m in ("generate_batch", "beam_search", "stream"))}
    assert defaults == {PREFILL_CHUNK}
    assert prefill_budget_for(cuda, None) == GPU_PREFILL_BUDGET > PREFILL_CHUNK
    assert prefill_budget_for(cuda, 64) == prefill_budget_for(cpu, 64) == 64
    assert prefill_budget_for(SimpleNamespace(variant=SimpleNamespace(kv_device="cuda")), None) == PREFILL_CHUNK


@pytest.mark.parametrize("graph", ["standard", "kv_buffer"])
def test_a_burst_of_short_prompts_is_prefilled_in_runs_of_the_budget(gpt2_loaded, gpt2_kv_buffer_loaded, graph):
    model = gpt2_loaded if graph == "standard" else gpt2_kv_buffer_loaded
    texts = ["Hello world", "It is a truth universally", "In", "The quick brown fox", "A small", "Once upon"]
    requests = [CompletionRequest(tuple(model.encode(t)), 6, SamplingParams(greedy=True), ignore_eos=True)
                for t in texts]
    longest = max(len(r.prompt_ids) for r in requests)
    got, runs = _run(model, requests, budget=3 * longest)
    prefills = [run for run in runs if run[0] != "step"]
    assert all(kind == "group" for kind, _, _ in prefills)
    assert sum(k for _, k, _ in prefills) == len(requests)  # every newcomer prefilled exactly once
    assert len(prefills) < len(requests)  # some prefilled together, not one run each
    assert all(positions <= 3 * longest for _, _, positions in prefills)
    for r, c in zip(requests, got, strict=True):  # left padding in a group changes no greedy token
        assert c.last.generation.ids == model.generate(list(r.prompt_ids), 6, greedy=True, ignore_eos=True).ids


def test_a_running_row_waits_at_most_one_budgeted_prefill_run(gpt2_kv_buffer_loaded):
    model = gpt2_kv_buffer_loaded
    budget = 4
    long_ids = tuple(model.encode("It is a truth universally acknowledged that a single man in possession of a"))
    assert len(long_ids) > 2 * budget
    requests = [CompletionRequest(tuple(model.encode("Hello world")), 40, SamplingParams(greedy=True),
                                  ignore_eos=True)]
    requests += [CompletionRequest(ids, 5, SamplingParams(greedy=True), ignore_eos=True)
                 for ids in [long_ids] + [tuple(model.encode(t)) for t in ("In", "A", "The", "So it")]]
    got, runs = _run(model, requests, budget=budget, max_batch=6)
    assert runs[0][0] == "group" and runs[1][0] == "step"  # the first row runs before the long prompt starts
    between = 0  # prefill runs since the last decode step
    for kind, _, positions in runs[1:]:
        if kind == "step":
            between = 0
        else:
            between += 1
            assert positions <= budget and between <= 1, runs
    assert [kind for kind, _, _ in runs].count("chunk") >= 3  # the long prompt went in budget-sized chunks
    for r, c in zip(requests, got, strict=True):
        assert c.last.generation.ids == model.generate(list(r.prompt_ids), r.max_new_tokens, greedy=True,
                                                       ignore_eos=True).ids


def test_a_failed_group_prefill_fails_its_requests_and_loses_none(gpt2_kv_buffer_loaded):
    model = gpt2_kv_buffer_loaded
    requests = [CompletionRequest(tuple(model.encode(t)), 4) for t in ("Hello", "World", "Again")]
    got, _ = _run(model, requests, budget=64, fail_groups=True)
    for c in got:
        assert c.last.finish_reason is FinishReason.ERROR and "injected prefill failure" in c.last.error


@pytest.mark.parametrize("spin", [True, False])
def test_session_spin_setting_reaches_onnx_runtime(gpt2_kv_buffer_loaded, spin):
    from gptedge.runtime import SessionConfig, load

    model = load(gpt2_kv_buffer_loaded.model_dir, device="cpu", session=SessionConfig(threads=1, spin=spin))
    options = model.session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == ("1" if spin else "0")
