"""The Python API speaks in gptedge's errors: a wrong argument raises TypeError (wrong type) or
InvalidArgumentError (out of range) with one line naming it, before any work, never OverflowError /
AttributeError / a tokenizer's "TextInputSequence must be str" from deep inside. And an exception in one
request's event callback ends that request only: its batch-mates finish as generate() would have them."""

from __future__ import annotations

import threading

import pytest

from gptedge.runtime import SessionConfig, load
from gptedge.runtime.errors import InvalidArgumentError
from gptedge.runtime.generation.constraints import ConstraintCompiler, ConstraintSpec
from gptedge.runtime.generation.sampling import SamplingParams
from gptedge.runtime.serving.engine import CompletionRequest, Engine


def _constraint_for(model, vocab_size: int):
    """A compiled regex constraint for a vocabulary of vocab_size ids (another model's, when it is not m's)."""
    return ConstraintCompiler(model.tokenizer, vocab_size, model.manifest.stop_ids).compile(
        ConstraintSpec("regex", "a+"))


# (what, call on the loaded model m, error type, words the one line must hold)
CASES = [
    ("surrogate prompt", lambda m: m.generate("\ud800abc", max_new_tokens=2), InvalidArgumentError,
     "the prompt holds a lone surrogate (U+D800 at index 0)"),
    ("surrogate prompt in a batch", lambda m: m.generate_batch(["ok", "x\udcff"], max_new_tokens=2),
     InvalidArgumentError, "lone surrogate (U+DCFF at index 1)"),
    ("surrogate stop string", lambda m: m.generate("Hi", max_new_tokens=2, stop=["\ud800"]), InvalidArgumentError,
     "a stop string holds a lone surrogate"),
    ("surrogate to encode", lambda m: m.encode("a\ud800"), InvalidArgumentError, "lone surrogate"),
    ("stop=5", lambda m: m.generate("Hi", max_new_tokens=2, stop=5), TypeError, "stop is a list of strings"),
    ("stop='x'", lambda m: m.generate("Hi", max_new_tokens=2, stop="x"), TypeError, "got str 'x'"),
    ("decode([-1])", lambda m: m.decode([-1]), InvalidArgumentError, "token id -1 is outside the vocabulary"),
    ("decode([10**30])", lambda m: m.decode([10**30]), InvalidArgumentError, "outside the vocabulary (0..50256)"),
    ("decode([vocab])", lambda m: m.decode([50257]), InvalidArgumentError, "token id 50257 is outside"),
    ("decode(['a'])", lambda m: m.decode(["a"]), TypeError, "token ids are integers, got str 'a'"),
    ("decode(5)", lambda m: m.decode(5), TypeError, "must be a sequence of integers, got int 5"),
    ("Engine(m, max_batch='8')", lambda m: Engine(m, max_batch="8"), TypeError, "max_batch must be an integer"),
    ("Engine(m, max_batch=True)", lambda m: Engine(m, max_batch=True), TypeError, "got bool True"),
    ("Engine(m, max_batch=0)", lambda m: Engine(m, max_batch=0), InvalidArgumentError, "max_batch must be >= 1"),
    ("Engine(m, max_queue=1.5)", lambda m: Engine(m, max_queue=1.5), TypeError, "max_queue must be an integer"),
    ("Engine(m, prefill_chunk=0)", lambda m: Engine(m, prefill_chunk=0), InvalidArgumentError, "prefill_chunk"),
    ("Engine(None)", lambda m: Engine(None), TypeError, "Engine() takes a loaded model"),
    ("engine.submit('hello')", lambda m: Engine(m).submit("hello", print), TypeError,
     "submit() takes a CompletionRequest, got str"),
    ("engine.submit(r, None)", lambda m: Engine(m).submit(CompletionRequest((1,), 2), None), TypeError,
     "on_event must be callable"),
    ("engine.submit(constraint for another vocabulary)", lambda m: Engine(m).submit(CompletionRequest(
        (1,), 2, constraint=_constraint_for(m, m.manifest.shape.vocab_size + 64)), print), InvalidArgumentError,
     "the constraint was compiled for 50321 tokens, this model has 50257"),
    ("CompletionRequest('ab')", lambda m: CompletionRequest("ab", 2), TypeError, "prompt_ids must be a sequence"),
    ("CompletionRequest(sampling=dict)", lambda m: CompletionRequest((1,), 2, {"top_k": 1}), TypeError,
     "sampling must be a SamplingParams"),
    ("CompletionRequest(stop='x')", lambda m: CompletionRequest((1,), 2, stop="x"), TypeError, "stop is a list"),
    ("CompletionRequest(logprobs=-1)", lambda m: CompletionRequest((1,), 2, logprobs=-1), InvalidArgumentError,
     "logprobs must be 0..100"),
    ("unknown sampling option", lambda m: m.generate("Hi", topk=5), TypeError, "unknown option 'topk'"),
    ("ignore_eos='no'", lambda m: m.generate("Hi", max_new_tokens=2, ignore_eos="no"), TypeError,
     "ignore_eos must be True or False"),
    ("with_text='yes'", lambda m: m.generate_batch(["Hi"], 2, with_text="yes"), TypeError, "with_text must be"),
    ("load(5)", lambda m: load(5), TypeError, "load() takes a model directory path, got int"),
    ("load(session=dict)", lambda m: load(m.model_dir, session={"threads": 1}), TypeError,
     "session is a SessionConfig"),
]


@pytest.mark.parametrize("what, call, error, says", CASES, ids=[c[0] for c in CASES])
def test_bad_argument_raises_gptedges_error(gpt2_loaded, what, call, error, says):
    with pytest.raises(Exception) as caught:
        call(gpt2_loaded)
    assert type(caught.value) is error, f"{what}: {type(caught.value).__name__}: {caught.value}"
    message = str(caught.value)
    assert says in message and "\n" not in message


def test_good_arguments_still_work(gpt2_loaded):
    """The checks refuse only what is wrong: numpy ints, tuples, None stop lists and SessionConfig pass."""
    import numpy as np

    ids = gpt2_loaded.encode("Hello world")
    assert gpt2_loaded.decode(np.array(ids)) == gpt2_loaded.decode(tuple(ids)) == "Hello world"
    out = gpt2_loaded.generate(np.array(ids), max_new_tokens=2, stop=None, ignore_eos=np.bool_(True))
    assert len(out.ids) == 2
    assert load(gpt2_loaded.model_dir, device="cpu", session=SessionConfig(threads=1)).manifest == gpt2_loaded.manifest
    assert CompletionRequest([1, 2], 3, stop=["x"]).prompt_ids == (1, 2)


def test_a_raising_callback_ends_only_its_own_request(gpt2_kv_buffer_loaded):
    """A callback that raises ends only its own request, early; the others in flight finish as they would alone,
    none with finish_reason 'error'."""
    model = gpt2_kv_buffer_loaded
    ids = tuple(model.encode("It is a truth universally acknowledged"))
    engine = Engine(model, max_batch=4).start()
    done, events = threading.Event(), []

    def good(event):
        events.append(event)
        if event.finish_reason:
            done.set()

    calls = []

    def bad(event):
        calls.append(event)
        raise RuntimeError("the client's handler broke")

    engine.submit(CompletionRequest(ids, 40, SamplingParams(greedy=True), ignore_eos=True), good)
    engine.submit(CompletionRequest(ids[:3], 40, SamplingParams(greedy=True), ignore_eos=True), bad)
    assert done.wait(60)
    engine.stop(grace_s=1)
    assert events[-1].finish_reason == "length"
    assert [e.token_id for e in events if e.token_id is not None] == model.generate(list(ids), 40, greedy=True,
                                                                                      ignore_eos=True).ids
    assert len(calls) < 40  # the broken request ended early; the engine still runs for others
    assert engine.metrics.finish_reasons["error"] == 0
