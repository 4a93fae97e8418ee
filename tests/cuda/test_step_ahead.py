"""The engine's next step run while this one's tokens are emitted (runtime/serving/step_ahead.py), on the CPU through
the GPU's slot pool: the same tokens as generate, slots freed only once the step out is back, and a step that fails
out there failing its rows and nothing else."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from gptedge.runtime import load
from gptedge.runtime.generation.sampling import SamplingParams
from gptedge.runtime.graphs.sequence_pool import drain
from gptedge.runtime.serving.engine import CompletionRequest, Engine, FinishReason

from ..support.engine import Collector, staggered_requests
from .test_device_slot_pool import _device_pool, _served

pytestmark = pytest.mark.slow  # the GPU slot pool built and run on the CPU against the engine

GREEDY = SamplingParams(greedy=True)


@pytest.fixture()
def served(gpt2_kv_buffer_loaded):
    """A model whose engine pool is the GPU's (narrow decoders, a decode session of the decode graph picking each
    step's tokens itself, the ArgMax session after a prefill), each pool kept in .pools."""
    model = load(gpt2_kv_buffer_loaded.model_dir, device="cpu")
    model.variant.pick_on_device = True
    model.pools = []

    def pool(capacity, max_length):
        model.pools.append(_device_pool(model, capacity, narrow=True, decode_graph=True))  # as the GPU's
        return model.pools[-1]

    model.variant.sequence_pool = pool
    return model


def _engine(model, **kw) -> Engine:
    """An engine over the served model's pool that steps ahead from one row (MIN_ROWS is for a GPU's batches)."""
    engine = Engine(model, **kw)
    engine._ahead.min_rows = 1
    return engine


def _greedy(model, n: int) -> list[CompletionRequest]:
    """n greedy requests of varied prompts, lengths and stop strings (they end on different steps)."""
    return [CompletionRequest(r.prompt_ids, r.max_new_tokens, sampling=GREEDY, stop=r.stop)
            for r in staggered_requests(model, n)]


def _slow_steps(pool, delay_s: float, during: list[int]):
    """Make each step_picked take delay_s longer, counting in during[0] the calls in progress."""
    step = pool.step_picked

    def slow(*args):
        during[0] += 1
        try:
            time.sleep(delay_s)
            return step(*args)
        finally:
            during[0] -= 1

    pool.step_picked = slow


def test_steps_run_ahead_give_generates_tokens_and_free_every_slot(served):
    requests = _greedy(served, 9)
    solo = [served.generate(list(r.prompt_ids), r.max_new_tokens, stop=r.stop, greedy=True) for r in requests]
    engine = _engine(served, max_batch=4, max_queue=16, prefill_chunk=None)
    got = _served(engine, requests)
    assert [c.last.generation.ids for c in got] == [w.ids for w in solo]
    assert [c.last.generation.text for c in got] == [w.text for w in solo]
    assert engine._ahead.launched > 5  # most steps ran ahead once the queue was empty
    pool = served.pools[0]
    assert sorted(pool._free) == list(range(4)) and not pool._joined and not pool._slot


def test_a_row_that_ends_while_a_step_is_out_keeps_its_slot_until_the_step_is_back(served):
    """Rows end among the tokens being emitted while the next step (over their slots too) runs: freeing a slot then
    would change the mask and positions that step reads. Each remove must come when no step is running."""
    requests = [CompletionRequest(r.prompt_ids, 3 + 2 * i, sampling=GREEDY, ignore_eos=True)
                for i, r in enumerate(_greedy(served, 4))]
    solo = [served.generate(list(r.prompt_ids), r.max_new_tokens, greedy=True, ignore_eos=True) for r in requests]
    engine = _engine(served, max_batch=4, max_queue=8, prefill_chunk=None)
    pool = served.pools[0]
    during, removed_while_out = [0], []
    _slow_steps(pool, 0.02, during)
    remove = pool.remove
    pool.remove = lambda seq: (removed_while_out.append(seq) if during[0] else None, remove(seq))[1]
    got = _served(engine, requests)
    assert engine._ahead.launched > 3
    assert removed_while_out == []
    assert [c.last.generation.ids for c in got] == [w.ids for w in solo]
    assert sorted(pool._free) == list(range(4))


def test_a_cancelled_row_ends_the_steps_ahead_and_the_others_go_on(served):
    requests = [CompletionRequest(r.prompt_ids, 24, sampling=GREEDY, ignore_eos=True) for r in _greedy(served, 3)]
    solo = [served.generate(list(r.prompt_ids), 24, greedy=True, ignore_eos=True) for r in requests]
    engine = _engine(served, max_batch=4, max_queue=8, prefill_chunk=None)
    got, handles = [Collector() for _ in requests], []

    def cancelling(event):  # the middle request cancels itself at its fourth token
        got[1](event)
        if len(got[1].events) == 4:
            handles[1].cancel()

    for r, c in zip(requests, (got[0], cancelling, got[2]), strict=True):
        handles.append(engine.submit(r, c))
    engine.start()
    assert all(c.finished() for c in got)
    engine.stop(grace_s=1)
    assert got[1].last.finish_reason == FinishReason.CANCELLED and len(got[1].events) < 24
    assert len(got[1].events) == 5  # after the cancel only its end, though a step was out over its row then
    assert [got[i].last.generation.ids for i in (0, 2)] == [solo[i].ids for i in (0, 2)]
    assert engine._ahead.launched > 10  # before the cancel and after it
    assert sorted(served.pools[0]._free) == list(range(4))


def test_a_step_that_fails_ahead_fails_its_rows_and_the_engine_serves_on(served):
    requests = [CompletionRequest(r.prompt_ids, 20, sampling=GREEDY, ignore_eos=True) for r in _greedy(served, 2)]
    engine = _engine(served, max_batch=4, max_queue=8, prefill_chunk=None)
    pool = served.pools[0]
    step, calls = pool.step_picked, []

    def failing(*args):  # the fifth step run ahead fails
        if threading.current_thread().name.startswith("gptedge-step"):
            calls.append(1)
            if len(calls) == 5:
                raise RuntimeError("CUDA error: an illegal memory access")
        return step(*args)

    pool.step_picked = failing
    got = [Collector() for _ in requests]
    for r, c in zip(requests, got, strict=True):
        engine.submit(r, c)
    engine.start()
    assert all(c.finished() for c in got)
    assert [c.last.finish_reason for c in got] == [FinishReason.ERROR] * 2
    assert all("illegal memory access" in c.last.error for c in got)
    assert sorted(pool._free) == list(range(4)) and not pool._joined
    after = _greedy(served, 1)[0]
    again = Collector()
    engine.submit(after, again)
    assert again.finished()
    engine.stop(grace_s=1)
    assert again.last.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
    want = served.generate(list(after.prompt_ids), after.max_new_tokens, stop=after.stop, greedy=True)
    assert again.last.generation.ids == want.ids


def test_the_pool_has_room_to_step_until_a_row_holds_its_last_position(gpt2_kv_buffer_loaded):
    model = gpt2_kv_buffer_loaded
    ctx = model.manifest.shape.context_length
    pool = _device_pool(model, 2)
    prompt = list(range(1, ctx - 2))  # ctx - 3 positions
    drain(pool.prefill(1, prompt, None))
    drain(pool.prefill(2, [5, 6], None))
    assert pool.room_to_step()
    pool.step([1, 2], np.array([7, 8]))
    pool.step([1, 2], np.array([7, 8]))
    assert pool.room_to_step()  # row 1 holds ctx - 1: one position left
    pool.step([1, 2], np.array([7, 8]))
    assert not pool.room_to_step()  # row 1 is full: a step would write past the cache
    pool.remove(1)
    assert pool.room_to_step()


def test_newcomers_held_back_share_one_prefill_run_while_a_row_decodes(served):
    """With a hold, newcomers arriving one by one beside a running row wait (the row decoding meanwhile, steps run
    ahead) and are prefilled together once the first has waited the hold; every request gets generate's tokens."""
    ctx = served.manifest.shape.context_length
    first = CompletionRequest(tuple(_greedy(served, 1)[0].prompt_ids), 60, sampling=GREEDY, ignore_eos=True)
    later = [CompletionRequest(r.prompt_ids, 6, sampling=GREEDY, ignore_eos=True) for r in _greedy(served, 4)[1:]]
    assert len(first.prompt_ids) + 60 <= ctx
    solo = [served.generate(list(r.prompt_ids), r.max_new_tokens, greedy=True, ignore_eos=True)
            for r in [first, *later]]
    engine = _engine(served, max_batch=4, max_queue=8, prefill_chunk=None, prefill_hold_ms=150)
    pool = served.pools[0]
    _slow_steps(pool, 0.005, [0])  # ~5 ms a step: the first row runs for ~300 ms
    groups = []
    prefill_group = pool.prefill_group_picked  # the engine's over a pool that picks on the device
    pool.prefill_group_picked = lambda seqs, prompts, needs, **kw: (groups.append(list(seqs)),
                                                                    prefill_group(seqs, prompts, needs, **kw))[1]
    waiting_at_launch = []
    launch = engine._ahead.launch
    engine._ahead.launch = lambda *a: (waiting_at_launch.append(len(engine._waiting)), launch(*a))[1]
    got = [Collector() for _ in range(4)]
    engine.submit(first, got[0])
    engine.start()
    while not got[0].events:
        time.sleep(0.001)
    for r, c in zip(later, got[1:], strict=True):
        engine.submit(r, c)
        time.sleep(0.02)
    events_before = len(got[0].events)
    assert all(c.finished() for c in got)
    engine.stop(grace_s=1)
    assert [len(g) for g in groups] == [1, 3]  # the first alone, then the three newcomers in one run
    assert len(got[0].events) > events_before  # the running row was not held
    assert max(waiting_at_launch) >= 1  # and its steps ran ahead while newcomers were held
    assert [c.last.generation.ids for c in got] == [w.ids for w in solo]


def test_a_batch_under_min_rows_steps_in_turn(served):
    """Below StepAhead.min_rows (16 by default) the two thread hand-overs cost more than the overlap saves: the
    engine steps in turn, with the same tokens."""
    requests = _greedy(served, 4)
    solo = [served.generate(list(r.prompt_ids), r.max_new_tokens, stop=r.stop, greedy=True) for r in requests]
    engine = Engine(served, max_batch=4, max_queue=8, prefill_chunk=None)
    assert engine._ahead.min_rows == 16
    got = _served(engine, requests)
    assert engine._ahead.launched == 0
    assert [c.last.generation.ids for c in got] == [w.ids for w in solo]


def test_a_full_batch_steps_ahead_while_requests_wait_for_a_row(served):
    """Nobody can be admitted while every row runs: queued requests do not stop the steps running ahead."""
    requests = [CompletionRequest(r.prompt_ids, 10 + 3 * i, sampling=GREEDY, ignore_eos=True)
                for i, r in enumerate(_greedy(served, 5))]
    solo = [served.generate(list(r.prompt_ids), r.max_new_tokens, greedy=True, ignore_eos=True) for r in requests]
    engine = _engine(served, max_batch=2, max_queue=8, prefill_chunk=None)
    waiting_at_launch = []
    launch = engine._ahead.launch
    engine._ahead.launch = lambda *a: (waiting_at_launch.append(len(engine._waiting)), launch(*a))[1]
    got = _served(engine, requests)
    assert max(waiting_at_launch) >= 1
    assert [c.last.generation.ids for c in got] == [w.ids for w in solo]
    assert sorted(served.pools[0]._free) == [0, 1]


def test_stop_with_a_step_out_cancels_the_rows_and_frees_every_slot(served):
    import sys

    sys.setswitchinterval(0.005)  # CPython's default, whatever an earlier test's engine left
    before = sys.getswitchinterval()
    requests = [CompletionRequest(r.prompt_ids, 40, sampling=GREEDY, ignore_eos=True) for r in _greedy(served, 3)]
    engine = _engine(served, max_batch=4, max_queue=8, prefill_chunk=None)
    pool = served.pools[0]
    _slow_steps(pool, 0.01, [0])
    got = [Collector() for _ in requests]
    for r, c in zip(requests, got, strict=True):
        engine.submit(r, c)
    engine.start()
    while engine._ahead.launched < 3:
        time.sleep(0.002)
    assert sys.getswitchinterval() < before  # lowered while it steps ahead
    engine.stop(grace_s=0)
    assert all(c.finished(timeout=5) for c in got)
    assert [c.last.finish_reason for c in got] == [FinishReason.CANCELLED] * 3
    assert sorted(pool._free) == list(range(4)) and not pool._joined
    assert sys.getswitchinterval() == before  # and put back when it closed


class _CountingPool:
    """A pool stand-in: each step picks every fed token + 1; records removes and the steps run."""

    def __init__(self):
        self.steps, self.removed = [], []

    def step_picked(self, seqs, tokens, needs):
        self.steps.append(list(np.asarray(tokens)))
        return np.asarray(tokens) + 1, None

    def room_to_step(self) -> bool:
        return True

    def remove(self, seq: int) -> None:
        self.removed.append(seq)


def _until(condition, bound_s: float = 10.0) -> None:
    deadline = time.monotonic() + bound_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert condition()


def test_a_chain_runs_its_depth_ahead_of_the_engine_then_waits_for_it():
    from gptedge.runtime.serving.step_ahead import StepAhead

    pool = _CountingPool()
    ahead = StepAhead(pool, min_rows=1, depth=2)
    ahead.launch([7, 9], np.array([10, 20]))
    _until(lambda: len(pool.steps) == 2)
    time.sleep(0.05)
    assert len(pool.steps) == 2  # two steps done and not taken: the chain waits
    assert ahead.take() == {7: 11, 9: 21}  # each step fed the last one's picks
    _until(lambda: len(pool.steps) == 3)
    assert pool.steps == [[10, 20], [11, 21], [12, 22]]
    assert ahead.take() == {7: 12, 9: 22}
    with pytest.raises(ValueError, match="depth must be >= 1"):  # 0: the worker would wait for nobody
        StepAhead(pool, min_rows=1, depth=0)
    ahead.launch([7, 9], np.array([12, 22]))  # the chain goes on by itself: a no-op
    assert ahead.take() == {7: 13, 9: 23}
    ahead.close()
    assert not ahead.out


def test_a_chain_stopped_while_it_waits_leaves_its_steps_to_take_then_none_and_frees_the_leavers():
    from gptedge.runtime.serving.step_ahead import StepAhead

    pool = _CountingPool()
    ahead = StepAhead(pool, min_rows=1, depth=2)
    ahead.launch([7, 9], np.array([10, 20]))
    _until(lambda: len(pool.steps) == 2)
    ahead.remove(9)  # a row ended: the chain stops; its slot waits for the chain to end
    assert ahead.take() == {7: 11, 9: 21}
    assert ahead.take() == {7: 12, 9: 22}  # done before the stop: still the engine's, in order
    assert ahead.take() is None  # it ended in its wait: nothing more comes
    assert pool.removed == [9] and len(pool.steps) == 2 and not ahead.out
    assert ahead.can_launch(1)
    ahead.close()


def test_a_chain_that_ended_does_not_mark_the_next_one_ended():
    """The engine may launch the next chain as soon as the last one has ended its steps, before the last one's worker
    call has returned: what that call does on its way out must not mark the next chain ended (the engine would then
    take the pool back while the next chain steps it)."""
    from gptedge.runtime.serving.step_ahead import StepAhead

    ended, release, first_returned, second_go = (threading.Event() for _ in range(4))

    class Lingering(StepAhead):
        def _steps(self, seqs, tokens):
            super()._steps(seqs, tokens)
            if not ended.is_set():  # the first chain only: linger after its end
                ended.set()
                release.wait(10)

        def _chain(self, *args):
            super()._chain(*args)
            first_returned.set()

    class OneStepPool(_CountingPool):
        def step_picked(self, seqs, tokens, needs):
            if self.steps:  # the second chain's step waits for the test
                second_go.wait(10)
            return super().step_picked(seqs, tokens, needs)

        def room_to_step(self) -> bool:
            return False  # every chain ends after one step

    pool = OneStepPool()
    ahead = Lingering(pool, min_rows=1, depth=2)
    ahead.launch([1], np.array([10]))
    assert ended.wait(10)
    assert ahead.take() == {1: 11}
    ahead.launch([1], np.array([11]))  # the next chain: queued behind the first one's call
    release.set()
    assert first_returned.wait(10)
    assert ahead.out  # the second chain runs (its step waits): it must not read as ended
    second_go.set()
    assert ahead.take() == {1: 12}
    assert pool.steps == [[10], [11]]
    ahead.close()
