"""The GPU's slot pool (runtime/graphs/device_slot_pool.py) on the CPU: the same slots, device-address bindings and one
decode run over every slot, through the CPU session, against the CPU's own SlotPool on one schedule of joins,
chunked prefills, steps and leaves; and the engine serving through it as through SlotPool."""

from __future__ import annotations

import numpy as np
import pytest

from gptedge.runtime import load
from gptedge.runtime.graphs.cuda_graph import GraphDecoder, decode_graph_bytes
from gptedge.runtime.graphs.device_slot_pool import DeviceSlotPool
from gptedge.runtime.graphs.kv_buffer_pool import SlotPool
from gptedge.runtime.graphs.sequence_pool import drain
from gptedge.runtime.graphs.session import make_session

pytestmark = pytest.mark.slow  # the GPU slot pool built and run on the CPU against the engine

A, B, C_, D = [5, 17, 300, 42, 7], [9, 8, 7, 6, 5, 4, 3, 2, 1], [1000, 2000], [11, 12, 13, 14, 15, 16, 17]


@pytest.fixture(scope="module")
def model(gpt2_kv_buffer_loaded):
    return load(gpt2_kv_buffer_loaded.model_dir, device="cpu")


def _device_pool(model, capacity: int, narrow: bool = False, decode_graph: bool = False) -> DeviceSlotPool:
    """The GPU's pool on the CPU; narrow: steps through decoders over the first rows only (as on a GPU); decode_graph:
    decode steps through a second session made from the decode graph (its own ArgMax: decode_graph_bytes), as the
    GPU's capture session, else through the model's session (the pick then by the ArgMax session)."""
    session = model.session
    if decode_graph:
        session = make_session(decode_graph_bytes((model.model_dir / "model.onnx").read_bytes()), device="cpu")
    narrower = (lambda rows, wide: GraphDecoder(model.variant, rows, session, rows_of=wide)) if narrow else None
    return DeviceSlotPool(model.variant, capacity, model.manifest.shape.context_length,
                          GraphDecoder(model.variant, capacity, session), narrower)


def _served(engine, requests) -> list:
    """Every request submitted to the engine (started here if it is not yet), all finished, the engine stopped ->
    one Collector per request."""
    from ..support.engine import Collector

    got = [Collector() for _ in requests]
    for r, c in zip(requests, got, strict=True):
        engine.submit(r, c)
    if engine._thread.ident is None:
        engine.start()
    assert all(c.finished() for c in got)
    engine.stop(grace_s=1)
    return got

def _schedule(pool, vocab: int = 50257) -> list[np.ndarray]:
    """Joins, a chunked prefill between steps, a leave and a slot reused: every logits array the pool returned (copied:
    step may return a view that the next step overwrites). Token ids taken modulo `vocab` (a tiny model's)."""
    a, b, c, d = ([i % vocab for i in p] for p in (A, B, C_, D))

    def t(*ids: int) -> np.ndarray:
        return np.array(ids) % vocab

    out = [drain(pool.prefill(1, a, None))]
    out.append(np.array(pool.step([1], t(3))))
    runs = pool.prefill(2, b, 4)  # 4 + 4 + 1 positions, the running row decoding between chunks
    next(runs)
    out.append(np.array(pool.step([1], t(4))))
    next(runs)
    out.append(np.array(pool.step([1], t(5))))
    out.append(drain(runs))
    out.append(np.array(pool.step([1, 2], t(6, 7))))
    out.append(pool.prefill_group([3], [c]))
    out.append(np.array(pool.step([2, 3, 1], t(8, 9, 10))))
    pool.remove(1)
    out.append(np.array(pool.step([3, 2], t(11, 12))))
    out.append(pool.prefill_group([4], [d]))  # takes the freed slot
    for k in range(6):
        out.append(np.array(pool.step([2, 4, 3], t(20 + k, 30 + k, 40 + k))))
    return out


@pytest.mark.parametrize("narrow", [False, True], ids=["every-row", "rows-in-use"])
def test_device_slot_pool_equals_the_cpu_slot_pool(model, narrow):
    ctx = model.manifest.shape.context_length
    want = _schedule(SlotPool(model.variant, 4, ctx))
    pool = _device_pool(model, 4, narrow)
    got = _schedule(pool)
    if narrow:  # one, two and then four rows stepped (the lowest free slot is taken, a freed one reused)
        assert sorted(pool._decoders) == [1, 2, 4]
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_allclose(g, w, atol=2e-5, rtol=0, err_msg=f"call {i}")


def test_device_slot_pool_equals_the_cpu_slot_pool_with_the_rotary_inside_the_attention(tmp_path_factory):
    """A Llama-style dir whose GroupQueryAttention rotates q and k itself (export/graph_rotary.py): its rows, each
    starting at position 0 with the mask wider than they are, rotated at their own positions as on the CPU's pool."""
    import onnx

    from gptedge.export.exporter import export_checkpoint

    from ..support.lineage_checkpoints import VOCAB, write_variant_checkpoint

    root = tmp_path_factory.mktemp("rotary_inside_pool")
    export_checkpoint(write_variant_checkpoint(root / "ckpt", "gqa2-linear", tokenizer=False), root / "dir",
                      graph_variant="kv_buffer", validate=False)
    graph = onnx.load(str(root / "dir" / "model.onnx"), load_external_data=False).graph
    assert not any(n.op_type == "RotaryEmbedding" for n in graph.node)
    llama = load(root / "dir", device="cpu")
    ctx = llama.manifest.shape.context_length
    want = _schedule(SlotPool(llama.variant, 4, ctx), VOCAB)
    got = _schedule(_device_pool(llama, 4, narrow=True), VOCAB)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_allclose(g, w, atol=2e-5, rtol=0, err_msg=f"call {i}")


def test_device_slot_pool_refuses_what_it_cannot_hold(model):
    pool = _device_pool(model, 2)
    drain(pool.prefill(1, A, None))
    drain(pool.prefill(2, B, None))
    with pytest.raises(RuntimeError, match="full"):
        drain(pool.prefill(3, C_, None))
    with pytest.raises(RuntimeError, match="every joined sequence"):
        pool.step([1], np.array([0]))
    pool.remove(2)
    pool.remove(2)  # twice: nothing happens
    drain(pool.prefill(3, C_, None))  # the slot is reused
    assert pool.step([1, 3], np.array([1, 2])).shape == (2, model.manifest.shape.vocab_size)


def test_the_engine_through_the_device_slot_pool_gives_solo_greedy_results(model):
    from gptedge.runtime.serving.engine import CompletionRequest, Engine
    from gptedge.runtime.generation.sampling import SamplingParams

    from ..support.engine import staggered_requests

    served = load(model.model_dir, device="cpu")
    served.variant.sequence_pool = lambda capacity, max_length: _device_pool(served, capacity)
    requests = [CompletionRequest(r.prompt_ids, r.max_new_tokens, sampling=SamplingParams(greedy=True), stop=r.stop)
                for r in staggered_requests(served, 10)]
    solo = [served.generate(list(r.prompt_ids), r.max_new_tokens, stop=r.stop, greedy=True) for r in requests]
    engine = Engine(served, max_batch=3, max_queue=16, prefill_chunk=4).start()
    assert isinstance(engine.pool, DeviceSlotPool)
    got = _served(engine, requests)
    assert [c.last.generation.ids for c in got] == [w.ids for w in solo]


def test_step_picked_picks_each_greedy_row_on_the_device_and_copies_only_flagged_rows(model):
    """The decoder's ArgMax session (the GPU's, here on the CPU) picks what numpy's argmax of step()'s logits
    picks, in seqs' order, and only the flagged rows' logits come back."""
    picking = load(model.model_dir, device="cpu")
    picking.variant.pick_on_device = True  # the one-node ArgMax session on the CPU, as on a GPU
    # picked by the ArgMax session after each step; by the decode graph's own ArgMax (the GPU's capture session)
    pools = [_device_pool(model, 4), _device_pool(picking, 4, narrow=True),
             _device_pool(picking, 4, narrow=True, decode_graph=True)]
    assert pools[1].decoder._pick is not None and pools[1].decoder.picked is None
    assert pools[2].decoder.picked is not None
    for p in pools:
        drain(p.prefill(1, A, None))
        drain(p.prefill(2, B, None))
        drain(p.prefill(3, C_, None))
    fed = np.array([8, 9, 10])
    argmax_runs = _counting_runs(picking.variant.argmax_session)
    for t in range(4):
        want = pools[0].step([3, 1, 2], fed + t)  # (3, V)
        for p in pools[1:]:
            picked, logits = p.step_picked([3, 1, 2], fed + t, [False, True, False])
            assert picked.tolist() == want.argmax(-1).tolist()
            assert logits.shape == (1, want.shape[1])
            np.testing.assert_allclose(logits[0], want[1], atol=2e-5, rtol=0)
    assert argmax_runs == [None] * 4  # the ArgMax session ran for pools[1] only: pools[2]'s steps picked themselves
    for p in pools[1:]:
        picked, logits = p.step_picked([3, 1, 2], fed, [False] * 3)
        assert logits is None and picked.shape == (3,) and picked.dtype == np.int64


def test_a_shared_prefill_picks_the_first_tokens_on_the_device_when_no_row_needs_its_logits(model):
    """prefill_group_picked: with no row flagged, each row's first token is the argmax of what prefill_group gives
    it (picked by one ArgMax session run over the logits left on the device, after a decode step whose own picks
    are stale by then); a group with a flagged row gets every row's logits (m rows to the host, as before); a pool
    that does not pick on the device returns logits for all."""
    picking = load(model.model_dir, device="cpu")
    picking.variant.pick_on_device = True
    plain, pool = _device_pool(model, 8), _device_pool(picking, 8, decode_graph=True)  # steps: the widest decoder's
    for p in (plain, pool):  # a decode step first: the decoder's own picks are then fresh, and not the newcomers'
        drain(p.prefill(1, A, None))
        p.step([1], np.array([8]))
    room = [len(p) + 6 for p in (B, C_, D)]  # short enough to share one run (padded to B's length)
    want = plain.prefill_group([2, 3, 4], [B, C_, D], room=room)  # (3, V)
    argmax_runs = _counting_runs(picking.variant.argmax_session)
    got = pool.prefill_group_picked([2, 3, 4], [B, C_, D], [False] * 3, room=room)
    assert len(argmax_runs) == 1  # one pick for the shared run
    assert all(isinstance(t, int) for t in got) and got == [int(w.argmax()) for w in want]
    fed = np.array([9, *got])
    assert pool.step_picked([1, 2, 3, 4], fed, [False] * 4)[0].tolist() == plain.step([1, 2, 3, 4],
                                                                                        fed).argmax(-1).tolist()
    for p in (plain, pool):
        for seq in (2, 3, 4):
            p.remove(seq)
    want = plain.prefill_group([2, 3, 4], [B, C_, D], room=room)
    mixed = pool.prefill_group_picked([2, 3, 4], [B, C_, D], [False, True, False], room=room)
    assert len(argmax_runs) == 1 and all(isinstance(r, np.ndarray) for r in mixed)  # nothing picked
    np.testing.assert_allclose(np.stack(mixed), want, atol=2e-5, rtol=0)
    host = _device_pool(model, 8)
    drain(host.prefill(1, A, None))
    rows = host.prefill_group_picked([2, 3, 4], [B, C_, D], [False] * 3, room=room)  # none picked there
    assert all(isinstance(r, np.ndarray) for r in rows)
    np.testing.assert_allclose(np.stack(rows), want, atol=2e-5, rtol=0)


def _counting_runs(session) -> list:
    """Each run_with_iobinding of the session from now on appends to the list returned."""
    runs, run = [], session.run_with_iobinding

    def counted(*args, **kwargs):
        runs.append(run(*args, **kwargs))
        return runs[-1]

    session.run_with_iobinding = counted
    return runs


def test_the_engine_picks_greedy_rows_on_the_device_and_samples_the_rest_as_generate(model):
    """A batch of plain greedy rows beside sampled, penalised and logprob rows: each gets generate()'s tokens
    alone, and the plain greedy rows' logits never reach the host."""
    from gptedge.runtime.generation.sampling import SamplingParams
    from gptedge.runtime.serving.engine import CompletionRequest, Engine

    from ..support.engine import staggered_requests

    served = load(model.model_dir, device="cpu")
    served.variant.pick_on_device = True
    pools = []

    def pool(capacity, max_length):
        pools.append(_device_pool(served, capacity, narrow=True))
        return pools[-1]

    served.variant.sequence_pool = pool
    requests = staggered_requests(served, 8)  # greedy, top-k, top-p and penalised rows, in turn
    requests[4] = CompletionRequest(requests[4].prompt_ids, requests[4].max_new_tokens,
                                    sampling=SamplingParams(greedy=True), logprobs=2)
    solo = [served.generate(list(r.prompt_ids), r.max_new_tokens, stop=r.stop, sampling=r.sampling)
            for r in requests]
    engine = Engine(served, max_batch=4, max_queue=16, prefill_chunk=None).start()
    copied = []
    step_picked = pools[0].step_picked

    def spy(seqs, tokens, needs):
        picked, logits = step_picked(seqs, tokens, needs)
        copied.append((len(needs), sum(needs), 0 if logits is None else len(logits)))
        return picked, logits

    pools[0].step_picked = spy
    got = _served(engine, requests)
    assert [c.last.generation.ids for c in got] == [w.ids for w in solo]
    assert copied and all(flagged == back for _, flagged, back in copied)  # exactly the flagged rows' logits
    assert any(flagged < rows for rows, flagged, _ in copied)  # some rows were picked on the device
    assert any(0 < flagged < rows for rows, flagged, _ in copied)  # in steps beside rows that sampled
    assert got[4].events[0].logprob is not None  # the greedy row with logprobs read its logits


def test_a_group_shares_one_left_padded_run_over_neighbouring_slots(model):
    """prefill_group's shared run (rows left-padded into neighbouring slots, positions from each first token) gives
    the CPU SlotPool's logits, at the prefill and at every step after; a row whose padding would leave it too little
    room, or that keeps its prompt logits, runs alone."""
    ctx = model.manifest.shape.context_length
    want_pool, got_pool = SlotPool(model.variant, 4, ctx), _device_pool(model, 4, narrow=True)
    runs = []
    session_run = model.session.run_with_iobinding
    model.session.run_with_iobinding = lambda binding, *a: (runs.append(1), session_run(binding, *a))[1]
    try:
        got = got_pool.prefill_group([1, 2, 3], [A, B, C_], room=[len(A) + 6, len(B) + 6, len(C_) + 6])
        assert len(runs) == 1  # one run for the three
    finally:
        model.session.run_with_iobinding = session_run
    want = want_pool.prefill_group([1, 2, 3], [A, B, C_])
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)
    assert got_pool._start[:3].tolist() == [len(B) - len(A), 0, len(B) - len(C_)]
    fed = np.array([8, 9, 10])
    for t in range(5):
        np.testing.assert_allclose(got_pool.step([3, 1, 2], fed + t), want_pool.step([3, 1, 2], fed + t), atol=2e-5,
                                   rtol=0, err_msg=f"step {t}")
    got_pool.remove(2)  # a freed slot starts unpadded again
    assert got_pool._start[1] == 0

    # room: C_ padded to B's length would not fit its new tokens in the context, so it runs alone; D keeps its logits
    alone = _device_pool(model, 4, narrow=True)
    alone.prefill_group([1, 2, 3, 4], [A, B, C_, D], keep_all=[False, False, False, True],
                        room=[len(A) + 6, len(B) + 6, ctx - len(B) + len(C_) + 1, len(D) + 6])
    assert alone._slot == {1: 0, 2: 1, 3: 2, 4: 3}
    assert alone._start.tolist() == [len(B) - len(A), 0, 0, 0] and 4 in alone.prompt_logits


def test_a_group_without_neighbouring_free_slots_runs_one_by_one(model):
    pool = _device_pool(model, 4, narrow=True)
    for seq, prompt in ((1, A), (2, B), (3, C_)):
        drain(pool.prefill(seq, prompt, None))
    pool.remove(2)  # free: slots 1 and 3, not neighbours
    rows = pool.prefill_group([4, 5], [D, A], room=[len(D) + 4, len(A) + 4])
    assert pool._slot[4] == 1 and pool._slot[5] == 3 and pool._start.tolist() == [0, 0, 0, 0]
    want = SlotPool(model.variant, 2, model.manifest.shape.context_length).prefill_group([4, 5], [D, A])
    np.testing.assert_allclose(rows, want, atol=2e-5, rtol=0)


def test_the_engine_pads_a_newcomer_only_where_its_new_tokens_still_fit(model):
    """A short prompt beside a long one, asking for every position the context has left: padded to the long one's
    length it would run past the cache's end, so the engine's room keeps it in a run of its own, and both requests
    get generate()'s tokens; two that fit share one run."""
    from gptedge.runtime.generation.sampling import SamplingParams
    from gptedge.runtime.serving.engine import CompletionRequest, Engine


    served = load(model.model_dir, device="cpu")
    ctx = served.manifest.shape.context_length
    pools = []
    shared = []  # the seqs of each shared prefill run

    def pool(capacity, max_length):
        pools.append(_device_pool(served, capacity, narrow=True))
        together = pools[-1]._prefill_together
        pools[-1]._prefill_together = lambda seqs, prompts, first, *rest: (shared.append(list(seqs)), together(
            seqs, prompts, first, *rest))[1]
        return pools[-1]

    served.variant.sequence_pool = pool
    short, long_ = list(A), list(range(100, 130))  # 5 and 30 tokens
    greedy = SamplingParams(greedy=True)
    requests = [CompletionRequest(tuple(short), ctx - len(short), sampling=greedy, ignore_eos=True),
                CompletionRequest(tuple(long_), 6, sampling=greedy, ignore_eos=True),
                CompletionRequest(tuple(B), 6, sampling=greedy, ignore_eos=True)]
    solo = [served.generate(list(r.prompt_ids), r.max_new_tokens, greedy=True, ignore_eos=True) for r in requests]
    engine = Engine(served, max_batch=4, max_queue=8, prefill_chunk=None)  # started after all three are queued
    got = _served(engine, requests)
    assert [c.last.error for c in got] == [None] * 3
    assert [c.last.generation.ids for c in got] == [w.ids for w in solo]
    assert len(got[0].last.generation.ids) == ctx - len(short)  # it ran to the context's end
    assert len(shared) == 1 and len(shared[0]) == 2  # the long prompt and B shared a run; the short one ran alone


def test_a_turn_takes_at_most_one_prompt_scored_alone_beside_a_shared_run(model):
    """With no budget (as with the GPU's large one) the plan admits every newcomer; the rows that score their prompt
    run alone (a launch-bound run each), so the engine cuts a turn before its second such row: each prefill call
    holds at most one of them, the queue's order is kept, and every request gets what it would alone."""
    from gptedge.runtime.generation.sampling import SamplingParams
    from gptedge.runtime.serving.engine import CompletionRequest, Engine

    served = load(model.model_dir, device="cpu")
    calls = []  # per prefill call of the engine: its seqs and which of them keep their prompt's logits

    def pool(capacity, max_length):
        made = _device_pool(served, capacity, narrow=True)
        group = made.prefill_group_picked  # what the engine calls over this pool

        def spied(seqs, prompts, needs, **kw):
            calls.append((list(seqs), list(kw.get("keep_all") or [False] * len(seqs))))
            return group(seqs, prompts, needs, **kw)

        made.prefill_group_picked = spied
        return made

    served.variant.sequence_pool = pool
    greedy = SamplingParams(greedy=True)
    prompts = [A, B, C_, D, A[::-1], B[::-1]]
    scored = [True, False, True, True, False, False]
    requests = [CompletionRequest(tuple(p), 3, sampling=greedy, ignore_eos=True, prompt_logprobs=2 if s else None)
                for p, s in zip(prompts, scored, strict=True)]
    alone = _served(Engine(served, max_batch=8, max_queue=8, prefill_chunk=None), [requests[0]])  # a reference
    engine = Engine(served, max_batch=8, max_queue=8, prefill_chunk=None)  # started after all six are queued
    got = _served(engine, requests)
    assert all(sum(keep) <= 1 for _, keep in calls[1:]) and len(calls) > 2
    assert [seq for seqs, _ in calls[1:] for seq in seqs] == sorted(seq for seqs, _ in calls[1:] for seq in seqs)
    solo = [served.generate(list(r.prompt_ids), 3, greedy=True, ignore_eos=True) for r in requests]
    assert [c.last.generation.ids for c in got] == [w.ids for w in solo]
    assert got[0].events[0].prompt_logprobs == alone[0].events[0].prompt_logprobs


def test_a_shared_run_that_fails_frees_its_slots_through_remove(model):
    """The engine answers a failed run by removing its sequences: a shared run's slots must come back then."""
    pool = _device_pool(model, 4, narrow=True)
    real = model.session.run_with_iobinding

    def fail(binding, *a):
        raise RuntimeError("out of memory")

    model.session.run_with_iobinding = fail
    try:
        with pytest.raises(RuntimeError, match="out of memory"):
            pool.prefill_group([1, 2, 3], [A, B, C_], room=[20, 20, 20])
    finally:
        model.session.run_with_iobinding = real
    for seq in (1, 2, 3):
        pool.remove(seq)
    assert sorted(pool._free) == [0, 1, 2, 3]
    drain(pool.prefill(4, D, None))  # and the pool works on
    assert pool._slot[4] == 0
