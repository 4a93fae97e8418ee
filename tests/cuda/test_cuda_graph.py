"""The CUDA-graph decoder (runtime/graphs/cuda_graph.py) on the CPU: the same fixed buffers, context-wide mask and
two kinds of run as on a GPU, through the one CPU session, against the ordinary kv_buffer path.

What only a GPU shows (the capture itself, its speed) is in tests/cuda/test_cuda.py, skipped without CUDA.
"""

from __future__ import annotations

import gc
import json

import numpy as np
import pytest

from gptedge.runtime import SessionConfig, load
from gptedge.runtime import contract as C
from gptedge.runtime.graphs.cuda_graph import PICKED, GraphDecodeState, decode_graph_bytes
from gptedge.runtime.modeldir.onnx_wire import WireError, without_graph_input
from gptedge.runtime.graphs.session import make_session
from gptedge.runtime.errors import ModelDirError
from gptedge.runtime.graphs.kv_buffer_graph import KVBufferState

pytestmark = pytest.mark.slow  # the GPU decoder's graphs built and run on the CPU, per test

PROMPTS = [[5, 17, 300, 42, 7, 9, 11], [3, 4], [8000, 1, 2, 3, 4]]  # left-padded to 7


@pytest.fixture(scope="module")
def kvb(gpt2_kv_buffer_loaded):
    return gpt2_kv_buffer_loaded.model_dir


def _graph_model(path, pick_on_device: bool = False):
    """On the CPU, decode steps through a second session made from the decode graph, as on a GPU (uncaptured)."""
    model = load(path, device="cpu")
    model.variant.pick_on_device = pick_on_device  # the ArgMax session runs on the CPU too
    decode = make_session(decode_graph_bytes((model.model_dir / "model.onnx").read_bytes()), device="cpu")
    model.variant.enable_cuda_graphs(decode)
    return model


def test_the_decode_graph_has_no_logits_to_keep_input_an_argmax_output_and_nothing_else_changed(kvb):
    import onnx

    data = (kvb / "model.onnx").read_bytes()
    before, after = onnx.load_from_string(data), onnx.load_from_string(decode_graph_bytes(data))
    names = [i.name for i in before.graph.input]
    assert C.LOGITS_TO_KEEP in names and [i.name for i in after.graph.input] == [n for n in names
                                                                                 if n != C.LOGITS_TO_KEEP]
    pick = after.graph.node[-1]  # the greedy pick, after every other node
    assert (pick.op_type, list(pick.input), list(pick.output)) == ("ArgMax", [C.LOGITS], [PICKED])
    assert after.graph.output[-1].name == PICKED
    after.graph.input.insert(names.index(C.LOGITS_TO_KEEP), before.graph.input[names.index(C.LOGITS_TO_KEEP)])
    del after.graph.node[-1], after.graph.output[-1]
    assert after.SerializeToString() == before.SerializeToString()  # put back, byte for byte the original
    with pytest.raises(WireError, match="no input"):
        without_graph_input(data, "no_such_input")


def test_kv_buffer_export_claims_a_wide_mask(kvb):
    assert json.loads((kvb / "gptedge.json").read_text())["wide_mask"] is True


@pytest.mark.parametrize("pick_on_device", [False, True])
def test_graph_decoder_greedy_equals_ordinary_path(kvb, pick_on_device):
    plain = load(kvb, device="cpu")
    model = _graph_model(kvb, pick_on_device)
    assert isinstance(model.variant.start(3, 20), GraphDecodeState)
    gc.collect()
    for chunk in (None, 3):  # one prefill run, and chunks (a run over a non-empty past, batch 1 only on the CPU)
        prompts = PROMPTS if chunk is None else PROMPTS[:1]
        want = plain.generate_batch(prompts, max_new_tokens=24, greedy=True, ignore_eos=True, with_text=False,
                                    prefill_chunk=chunk)
        got = model.generate_batch(prompts, max_new_tokens=24, greedy=True, ignore_eos=True, with_text=False,
                                   prefill_chunk=chunk)
        assert [g.ids for g in got] == [w.ids for w in want]


def test_a_generation_after_another_of_its_batch_size_picks_its_first_token_from_its_prompt(kvb):
    """The decoder of a batch size outlives its generations: the next one's first pick (after its prefill run, which
    has no ArgMax of its own) is from its prompt, not the last generation's last step's picks."""
    plain, model = load(kvb, device="cpu"), _graph_model(kvb, pick_on_device=True)
    for prompts in (PROMPTS, [p[::-1] for p in PROMPTS]):
        want = plain.generate_batch(prompts, max_new_tokens=6, greedy=True, ignore_eos=True, with_text=False)
        got = model.generate_batch(prompts, max_new_tokens=6, greedy=True, ignore_eos=True, with_text=False)
        assert [g.ids for g in got] == [w.ids for w in want]
    decoder = model.variant.cuda_graphs._decoders[len(PROMPTS)]
    assert decoder.picked is not None  # the decode steps picked their own tokens


def test_a_replay_that_fails_falls_back_without_reading_its_stale_picks(kvb, monkeypatch):
    """A decode run the capture session refuses mid-generation (as a failed CUDA graph replay) goes on through the
    ordinary session, which has no ArgMax of its own: the picks after it are the ArgMax session's over the new
    logits, not what the capture session's pick buffer holds (marked -1 here as the replay fails), and greedy
    equals the ordinary path."""
    from gptedge.runtime.graphs.cuda_graph import GraphDecoder

    plain, model = load(kvb, device="cpu"), _graph_model(kvb, pick_on_device=True)
    graphs = model.variant.cuda_graphs
    session, runs = graphs.session, []
    run = session.run_with_iobinding

    def failing_once(*args, **kwargs):
        runs.append(1)
        if len(runs) == 4:  # the fourth decode step
            for d in graphs._decoders.values():
                d.picked.update_inplace(np.full((d.batch, 1), -1, np.int64))
            raise RuntimeError("replay failed")
        return run(*args, **kwargs)

    session.run_with_iobinding = failing_once
    pick, picks = GraphDecoder.pick, []

    def checked(self):  # every pick is the argmax of the logits the last run wrote
        picked = pick(self)
        picks.append(picked.tolist() == self.last_logits().argmax(-1).tolist())
        return picked

    monkeypatch.setattr(GraphDecoder, "pick", checked)
    want = plain.generate_batch(PROMPTS, max_new_tokens=10, greedy=True, ignore_eos=True, with_text=False)
    got = model.generate_batch(PROMPTS, max_new_tokens=10, greedy=True, ignore_eos=True, with_text=False)
    assert len(runs) == 4 and graphs.failed == "replay failed"
    assert len(picks) >= 9 and all(picks)
    assert [g.ids for g in got] == [w.ids for w in want]


def test_graph_decoder_logits_equal_ordinary_path(kvb):
    """Sampling reads every logit: the decoder's (B, V) after prefill and each step equal KVBufferState's."""
    model = _graph_model(kvb)
    from gptedge.runtime.generation.generation import left_pad, positions

    ids, mask = left_pad(PROMPTS, 0)
    graph_state, plain_state = model.variant.start(3, 16), KVBufferState(model.variant, 3, 16)
    assert isinstance(graph_state, GraphDecodeState)
    pos = positions(mask)
    for _ in range(4):
        a = graph_state.run(ids, mask, pos).copy()
        b = plain_state.run(ids, mask, pos).copy()
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
        ids = a.argmax(-1)[:, None]
        mask = np.concatenate([mask, np.ones((3, 1), np.int64)], axis=1)
        pos = mask.sum(1, keepdims=True) - 1
    # after prefill + 3 steps the mask's columns past the timeline are zeros in the bound buffer
    decoder = graph_state.decoder
    assert decoder.held == mask.shape[1] - 1 and not decoder.mask_host[:, decoder.held:].any()


def test_one_generation_per_batch_size_at_a_time(kvb):
    model = _graph_model(kvb)
    first = model.variant.start(2, 10)
    second = model.variant.start(2, 10)  # the batch size's buffers are in use: the ordinary path
    other = model.variant.start(1, 10)  # another batch size has its own
    assert isinstance(first, GraphDecodeState) and isinstance(second, KVBufferState)
    assert isinstance(other, GraphDecodeState) and other.decoder is not first.decoder
    decoder = first.decoder
    del first
    gc.collect()
    again = model.variant.start(2, 10)
    assert isinstance(again, GraphDecodeState) and again.decoder is decoder  # the same buffers, reused
    too_long = model.variant.start(3, model.manifest.shape.context_length + 1)
    assert isinstance(too_long, KVBufferState)


def test_beams_through_the_graph_decoder_equal_ordinary_path(kvb):
    plain = load(kvb, device="cpu")
    model = _graph_model(kvb)
    want = plain.beam_search(PROMPTS[:2], num_beams=3, max_new_tokens=12)
    got = model.beam_search(PROMPTS[:2], num_beams=3, max_new_tokens=12)
    assert [r.sequences for r in got] == [r.sequences for r in want]


def test_cuda_graph_off_on_the_cpu_and_by_config(kvb):
    assert load(kvb, device="cpu").variant.cuda_graphs is None  # the CPU has nothing to capture
    assert load(kvb, device="cpu", session=SessionConfig(cuda_graph=False)).variant.cuda_graphs is None


def test_a_wide_mask_claim_the_graph_does_not_honour_is_refused(gpt2_model_dir, tmp_path):
    import shutil

    for src, name in ((gpt2_model_dir, "std"),):
        bad = tmp_path / name
        shutil.copytree(src, bad)
        manifest = json.loads((bad / "gptedge.json").read_text())
        manifest["wide_mask"] = True
        (bad / "gptedge.json").write_text(json.dumps(manifest))
        with pytest.raises(ModelDirError, match="wide_mask"):
            load(bad, device="cpu")
