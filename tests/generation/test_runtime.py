"""Generation through the runtime: stops, streaming, batches, and running without torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from gptedge.runtime.errors import InvalidArgumentError, PromptTooLongError
from gptedge.runtime.generation.text_stream import TextStream
from gptedge.runtime.modeldir.tokenizer import encode


def test_stop_at_max_new_tokens_and_seeded_sampling(gpt2_loaded):
    a = gpt2_loaded.generate("Hello world", max_new_tokens=12, top_k=40, temperature=0.9, seed=3)
    b = gpt2_loaded.generate("Hello world", max_new_tokens=12, top_k=40, temperature=0.9, seed=3)
    c = gpt2_loaded.generate("Hello world", max_new_tokens=12, top_k=40, temperature=0.9, seed=4)
    assert a.ids == b.ids and a.ids != c.ids
    assert len(a.ids) == 12 and a.stop == "max_new_tokens" and a.prompt_ids == [15496, 995]
    assert a.text == gpt2_loaded.decode(a.ids)


def test_stop_at_eos(gpt2_model_dir):
    from gptedge.runtime import load

    loaded = load(gpt2_model_dir, device="cpu")
    first = loaded.generate("Hello", max_new_tokens=20, greedy=True).ids
    # Declare a token the model produces the end of text: generation must stop right after it.
    k = next((i for i in range(1, len(first)) if first[i] not in first[:i]), 0)
    loaded.manifest = loaded.manifest.replace(eos_id=first[k])
    out = loaded.generate("Hello", max_new_tokens=20, greedy=True)
    assert out.ids == first[: k + 1] and out.stop == "eos"


def test_stop_at_context_limit_is_reported(gpt2_loaded):
    prompt = list(range(100, 100 + 120))  # context holds 128
    out = gpt2_loaded.generate(prompt, max_new_tokens=50, greedy=True)
    assert len(out.ids) == 8 and out.stop == "context"


def test_prompt_longer_than_context(gpt2_loaded):
    with pytest.raises(PromptTooLongError, match="prompt is 128 tokens; the model's context holds 128"):
        gpt2_loaded.generate(list(range(128)), max_new_tokens=1)


def test_bad_generation_arguments(gpt2_loaded):
    with pytest.raises(InvalidArgumentError, match="max_new_tokens"):
        gpt2_loaded.generate("Hi", max_new_tokens=0)
    with pytest.raises(InvalidArgumentError, match="empty"):
        gpt2_loaded.generate("", max_new_tokens=3)
    with pytest.raises(InvalidArgumentError, match="top_p"):
        gpt2_loaded.generate("Hi", top_p=2.0)


def test_stop_string_ends_text_and_is_never_streamed(gpt2_loaded):
    full = gpt2_loaded.generate("Hello world", max_new_tokens=20, greedy=True)
    stop = full.text[5:9]  # something the model will produce
    stream = gpt2_loaded.stream("Hello world", max_new_tokens=20, greedy=True, stop=[stop])
    pieces = list(stream)
    out = stream.result
    assert out.stop == "stop_string"
    assert "".join(pieces) == out.text == full.text[: full.text.find(stop)]
    assert stop not in "".join(pieces)


def test_stream_concatenation_equals_text(gpt2_loaded):
    stream = gpt2_loaded.stream("It is a truth", max_new_tokens=30, top_k=50, seed=1)
    assert stream.result is None  # nothing runs until it is iterated
    pieces = list(stream)
    assert "".join(pieces) == stream.result.text
    assert len(pieces) > 5


def test_stream_holds_back_split_multibyte_characters(gpt2_loaded):
    tok = gpt2_loaded.tokenizer
    text = "é🦙日本"
    ids = encode(tok, text)
    assert len(ids) > len(text)  # characters really are split over tokens
    stream = TextStream(tok)
    pieces = [stream.push(i) for i in ids] + [stream.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


@pytest.mark.parametrize("graph", ["standard", "kv_buffer"])
@pytest.mark.parametrize("sampling", [{"greedy": True}, {"top_k": 20, "temperature": 0.8, "seed": 5}])
def test_batch_with_left_padding_equals_one_at_a_time(gpt2_loaded, gpt2_kv_buffer_loaded, sampling, graph):
    model = gpt2_loaded if graph == "standard" else gpt2_kv_buffer_loaded
    prompts = ["Hello world", "It is a truth universally acknowledged that", "In"]
    batch = model.generate_batch(prompts, max_new_tokens=16, **sampling)
    for prompt, got in zip(prompts, batch, strict=True):
        alone = model.generate(prompt, max_new_tokens=16, **sampling)
        assert got.ids == alone.ids and got.text == alone.text
    if graph == "kv_buffer":  # and both graphs agree
        assert [g.ids for g in batch] == [g.ids for g in gpt2_loaded.generate_batch(prompts, max_new_tokens=16,
                                                                                    **sampling)]


def test_runtime_runs_with_torch_unimportable(gpt2_model_dir):
    script = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None  # any import of torch now raises ImportError
        import gptedge.runtime as rt
        m = rt.load({str(gpt2_model_dir)!r}, device="cpu")
        out = m.generate("Hello world", max_new_tokens=8, greedy=True)
        assert len(out.ids) == 8, out
        assert not any(name == "torch" or name.startswith("torch.") for name in sys.modules if sys.modules[name])
        print("ok", out.ids)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok")


@pytest.mark.parametrize("graph", ["standard", "kv_buffer"])
def test_chunked_prefill_equals_one_run(gpt2_loaded, gpt2_kv_buffer_loaded, graph):
    """A prompt prefilled a few positions per run gives the logits and tokens of one run over it all."""
    import numpy as np

    from gptedge.runtime.generation.generation import left_pad, prefill

    model = gpt2_loaded if graph == "standard" else gpt2_kv_buffer_loaded
    # GroupQueryAttention (kv_buffer) chunks batch 1 only; the standard graph a left-padded batch
    prompts = [list(range(1000, 1017))] + ([list(range(2000, 2005)), [7]] if graph == "standard" else [])
    ids, mask = left_pad(prompts, pad_id=0)
    whole = prefill(model.variant.start(len(prompts), 20), ids, mask, chunk=None)
    whole = whole.copy()  # kv_buffer logits are a view the next step overwrites
    for chunk in (1, 4, 16):
        chunked = prefill(model.variant.start(len(prompts), 20), ids, mask, chunk=chunk)
        assert np.abs(chunked - whole).max() < 1e-4, chunk
    two = prompts[:1] + [list(range(2000, 2005))]  # a kv_buffer batch falls back to one run

    def ids_of(batch, chunk):
        return [g.ids for g in model.generate_batch(batch, max_new_tokens=8, greedy=True, ignore_eos=True,
                                                    prefill_chunk=chunk)]

    assert ids_of(prompts, 4) == ids_of(prompts, None) and ids_of(two, 4) == ids_of(two, None)


def test_python_api_refuses_wrong_types_and_ids_in_one_line(gpt2_loaded):
    """#11 row 12: a str where a list is expected, ids outside the vocabulary: clear errors, never ORT's."""
    with pytest.raises(TypeError, match="stop is a list of strings"):
        gpt2_loaded.generate("Hello", max_new_tokens=2, stop="the")
    with pytest.raises(TypeError, match="takes a list of prompts"):
        gpt2_loaded.generate_batch("abc", max_new_tokens=2)
    with pytest.raises(TypeError, match="token ids are integers"):
        gpt2_loaded.generate([1, "2"], max_new_tokens=2)
    for bad in (-1, 50257, 99999):
        with pytest.raises(InvalidArgumentError, match=f"token id {bad} is outside the vocabulary"):
            gpt2_loaded.generate([5, bad], max_new_tokens=2)


def test_sampling_params_passed_whole_or_as_fields(gpt2_loaded):
    from gptedge.runtime.generation.sampling import SamplingParams

    params = SamplingParams(top_k=20, temperature=0.8, seed=5)
    whole = gpt2_loaded.generate("Hello", 10, sampling=params)
    assert whole.ids == gpt2_loaded.generate("Hello", 10, top_k=20, temperature=0.8, seed=5).ids
    assert whole.ids != gpt2_loaded.generate("Hello", 10,
                                             sampling=SamplingParams(top_k=20, temperature=0.8, seed=6)).ids
    streamed = gpt2_loaded.stream("Hello", 10, sampling=params)
    assert "".join(streamed) == whole.text and streamed.result.ids == whole.ids
    with pytest.raises(TypeError, match="not both"):
        gpt2_loaded.generate("Hello", 4, sampling=params, seed=1)
    with pytest.raises(TypeError, match="is a SamplingParams"):
        gpt2_loaded.generate("Hello", 4, sampling={"seed": 1})
