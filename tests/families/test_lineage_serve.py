"""A Llama dir (GQA, untied head, Metaspace tokenizer with byte fallback and a bos token) behind `gptedge serve`, as
the GPT-2 dirs are (tests/serve/test_serve.py): completions, streamed or not, equal generate() on the prompt as the
checkpoint's tokenizer makes it (bos first). The same requests go to Ray Serve replicas in tests/ray/test_ray_llama.py
(on tests/ray's one cluster)."""

from __future__ import annotations

import asyncio

import pytest

from gptedge import runtime
from gptedge.export.exporter import export_checkpoint

from ..support.lineage_checkpoints import write_variant_checkpoint

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

NAME = "tiny"
PROMPTS = ["hello world", "the end", "it is in the", "héllo wörld"]  # é, ö: byte-fallback tokens


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("lineage_serve")
    checkpoint = write_variant_checkpoint(root / "ck", "gqa2-linear")
    export_checkpoint(checkpoint, root / "llama", graph_variant="kv_buffer", validate=False)
    return root / "llama"


@pytest.fixture(scope="module")
def solo(llama_dir):
    return runtime.load(llama_dir, device="cpu")


def bodies() -> list[dict]:
    out = [dict(model=NAME, prompt=p, max_tokens=6 + 5 * i, temperature=0, ignore_eos=True)
           for i, p in enumerate(PROMPTS)]
    for body in out[1::2]:
        body.update(stream=True, stream_options={"include_usage": True})
    return out


def assert_as_generate(solo, answers) -> None:
    for body, a in zip(bodies(), answers, strict=True):
        want = solo.generate(body["prompt"], body["max_tokens"], ignore_eos=True, greedy=True)
        assert want.prompt_ids[0] == 1  # <s>: the tokenizer config says add_bos
        assert a.status == 200 and a.error is None, a
        assert (a.text, a.finish_reason, a.completion_tokens) == (want.text, "length", len(want.ids)), body


def test_streamed_text_of_byte_fallback_runs_is_the_decoded_text(solo):
    """Byte-fallback tokens decode as one run: <0x69> <0x30> read "i0" until an invalid byte turns the whole run into
    U+FFFD. The stream holds a run back until it ends, so its pieces join into the final text (before: "i0", and
    nothing after, since the text no longer began with what was sent)."""
    from gptedge.runtime.generation.text_stream import TextStream

    ids = [108, 51, 216, 113, 274, 267]  # four byte tokens (0x69 0x30 0xD5 0x6E), then two pieces
    stream = TextStream(solo.tokenizer)
    pieces = [stream.push(i) for i in ids]
    assert "".join(pieces) + stream.flush() == solo.decode(ids) == "\ufffd" * 4 + "oh"
    assert pieces[:4] == ["", "", "", ""]
    stream = TextStream(solo.tokenizer)
    # "▁h" "<0xC3>" "<0xA9>" "l" "l" "o": é's two bytes come out with the piece that ends their run
    assert [stream.push(i) for i in solo.encode("héllo")] + [stream.flush()] == ["h", "", "", "él", "l", "o", ""]


def serve_answers(model_dir, log) -> tuple[list, dict]:
    """bodies() sent at once to `gptedge serve` of model_dir (2 rows a batch) -> (answers, /v1/models)."""
    from ..support.ray_cluster import complete
    from ..support.server import start_server, stop_server

    server = start_server(model_dir, log, "--max-batch", "2")
    try:
        async def run():
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
                return await asyncio.gather(*(complete(http, b) for b in bodies()))

        answers = asyncio.run(asyncio.wait_for(run(), 120))
        models = httpx.get(f"{server.url}/v1/models", timeout=10).json()
    finally:
        stop_server(server.proc)
    return answers, models


def test_serve_completions_equal_generate(llama_dir, solo, tmp_path):
    answers, models = serve_answers(llama_dir, tmp_path / "serve.log")
    assert_as_generate(solo, answers)
    assert [m["id"] for m in models["data"]] == [NAME]


@pytest.mark.parametrize("variant,graph", [("qwen2-qkv-bias", "kv_buffer"), ("neox-parallel", "standard")])
def test_serve_completions_of_qwen2_and_gpt_neox(variant, graph, tmp_path):
    """The same requests, streamed and not, batched two at a time, on Qwen2 (GQA, q/k/v biases) and GPT-NeoX
    (partial rotary, parallel residual), one on each graph."""
    checkpoint = write_variant_checkpoint(tmp_path / "ck", variant)
    export_checkpoint(checkpoint, tmp_path / variant, graph_variant=graph, validate=False)
    answers, _ = serve_answers(tmp_path / variant, tmp_path / "serve.log")
    assert_as_generate(runtime.load(tmp_path / variant, device="cpu"), answers)
