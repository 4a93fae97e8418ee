"""`gptedge serve` end to end: the real server in a subprocess on a free loopback port, called with the official
`openai` client and httpx. Completions equal generate()'s; errors come in OpenAI's shape; a client that leaves
frees its row; SIGTERM drains and exits 0. No timing assertions: every wait below is a bound, not a measure."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from ..support.openai_errors import openai_error  # noqa: E402 - after the skips: the server needs the extras
from ..support.server import NAME, start_server, stop_server  # noqa: E402 - after the optional-dependency skips above

KEY = "test-key"
MAX_BATCH, MAX_QUEUE = 4, 24
CONTEXT = 512  # room for a generation long enough that a client surely leaves before it ends
TOKENS_LIMIT = CONTEXT - 8  # --max-tokens-limit: above every test's own max_tokens
PREFILL_BUDGET = 8  # prompt positions per prefill run: most test prompts are longer (chunked), a few shorter (grouped)


@pytest.fixture(scope="module")
def serve_model_dir(tmp_path_factory):
    """The tiny seeded GPT-2 of conftest, with a longer context, exported as a kv_buffer graph. Unvalidated
    (test_export checks exports): these tests compare the server with this same dir loaded in-process."""
    from gptedge.export.exporter import export_checkpoint

    from ..support.checkpoints import built_once, tiny_reference, write_checkpoint

    def build(out: Path) -> Path:
        checkpoint = write_checkpoint(tiny_reference("gpt2", n_positions=CONTEXT), out.parent / "ck")
        export_checkpoint(checkpoint, out, graph_variant="kv_buffer", validate=False)
        return out
    return built_once(tmp_path_factory, "serve-model", build)


@pytest.fixture(scope="module")
def solo(serve_model_dir):
    """The same model loaded in-process: what `generate` gives each request alone."""
    from gptedge.runtime import load

    return load(serve_model_dir, device="cpu")


@pytest.fixture(scope="module")
def server(serve_model_dir, tmp_path_factory):
    s = start_server(serve_model_dir, tmp_path_factory.mktemp("log") / "serve.log", "--api-key", KEY,
                     "--max-batch", str(MAX_BATCH), "--max-queue", str(MAX_QUEUE), "--host", "127.0.0.1",
                     "--device", "cpu", "--max-tokens-limit", str(TOKENS_LIMIT),
                     # a small budget: short prompts prefilled in groups, longer ones alone in chunks, both paths served
                     "--prefill-budget", str(PREFILL_BUDGET), "--spin",
                     "--prefill-hold-ms", "1")  # newcomers beside running rows may wait 1 ms for company
    try:
        yield s
    finally:
        stop_server(s.proc)


def test_startup_line_states_the_prefill_budget_and_hold(server):
    assert f"prefill budget {PREFILL_BUDGET} (newcomers held up to 1 ms)," in server.log.read_text()


@pytest.fixture()
def client(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=60) as c:
        yield c


def post(server, body, key=KEY, **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{server.url}/v1/completions", json=body, headers=headers, **{"timeout": 60, **kw})


def solo_text(solo, prompt, max_tokens=16, stop=(), **sampling):
    return solo.generate(prompt, max_tokens, stop=list(stop), **sampling)


CASES = [  # (prompt, max_tokens, stop, sampling)
    ("Hello world", 12, (), dict(temperature=0)),
    ("It is a truth universally acknowledged", 30, (), dict(temperature=0.8, top_k=20, seed=7)),
    ("The quick brown fox", 24, (" the", "\n"), dict(top_p=0.9, seed=3)),
    ("A", 25, (), dict(temperature=0, repetition_penalty=1.3)),
]


def _extensions(sampling):
    """top_k and repetition_penalty go through extra_body, as any OpenAI client sends extensions."""
    std = {k: v for k, v in sampling.items() if k in ("temperature", "top_p", "seed")}
    return std, {k: v for k, v in sampling.items() if k not in std}


@pytest.mark.parametrize("case", range(len(CASES)))
def test_completion_and_stream_equal_generate(client, solo, case):
    prompt, max_tokens, stop, sampling = CASES[case]
    want = solo_text(solo, prompt, max_tokens, stop, **sampling)
    std, extra = _extensions(sampling)
    reason = "length" if want.stop in ("max_new_tokens", "context") else "stop"

    got = client.completions.create(model=NAME, prompt=prompt, max_tokens=max_tokens, stop=list(stop) or None,
                                    extra_body=extra, **std)
    assert got.choices[0].text == want.text and got.choices[0].finish_reason == reason
    assert got.usage.prompt_tokens == len(want.prompt_ids) and got.usage.completion_tokens == len(want.ids)

    chunks = list(client.completions.create(model=NAME, prompt=prompt, max_tokens=max_tokens, stream=True,
                                            stop=list(stop) or None, stream_options={"include_usage": True},
                                            extra_body=extra, **std))
    pieces = [c.choices[0] for c in chunks if c.choices]
    assert "".join(p.text for p in pieces) == want.text
    assert [p.finish_reason for p in pieces] == [None] * (len(pieces) - 1) + [reason]
    assert chunks[-1].usage.completion_tokens == len(want.ids)


def test_default_max_tokens_is_16_and_context_ends_with_length(client, solo):
    got = client.completions.create(model=NAME, prompt="Hello", temperature=0, extra_body={"ignore_eos": True})
    assert got.usage.completion_tokens == 16 and got.choices[0].finish_reason == "length"
    long_prompt = solo.decode(solo.encode("one two three four " * 200)[: CONTEXT - 5])
    got = client.completions.create(model=NAME, prompt=long_prompt, max_tokens=50, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert got.choices[0].finish_reason == "length" and got.usage.completion_tokens < 50


def test_list_prompt_echo_and_logprobs(server, solo):
    prompts = ["Hello world", "The quick brown fox", "A"]
    body = {"model": NAME, "prompt": prompts, "max_tokens": 10, "temperature": 0}
    got = post(server, body).json()
    assert [c["index"] for c in got["choices"]] == [0, 1, 2]
    for c, p in zip(got["choices"], prompts, strict=True):
        assert c["text"] == solo_text(solo, p, 10, temperature=0).text
    for ids in ([[1, 2, 3], [4, 5]], [7, 8, 9]):  # token-id prompts: a list of them, or one
        by_ids = post(server, {**body, "prompt": ids}).json()["choices"]
        assert [c["text"] for c in by_ids] == [solo_text(solo, p, 10, temperature=0).text
                                               for p in (ids if isinstance(ids[0], list) else [ids])]
    assert openai_error(post(server, {**body, "prompt": ["Hi", [1, 2]]}), 400)["param"] == "prompt"  # no mixing

    echoed = post(server, {**body, "echo": True}).json()
    for c, e, p in zip(got["choices"], echoed["choices"], prompts, strict=True):
        assert e["text"] == (p if isinstance(p, str) else solo.decode(p)) + c["text"]

    with_lp = post(server, {**body, "prompt": "Hello world", "logprobs": 3}).json()["choices"][0]
    lp = with_lp["logprobs"]
    assert with_lp["text"] == got["choices"][0]["text"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 10
    assert "".join(lp["tokens"]) == with_lp["text"]
    for token, logprob, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True):
        assert logprob <= 0 and len(top) == 3 and top[token] == logprob == max(top.values())  # greedy: the top one


@pytest.mark.slow  # sixteen generations through the server and alone
def test_sixteen_concurrent_requests_get_their_solo_results(server, solo):
    """Greedy rows equal generate() exactly. Sampled rows in a batch see logits up to ~1e-7 away from solo ones
    (GroupQueryAttention reduces over the batch's shared timeline, where a row's keys sit behind left padding;
    measured on AVX-512), and a sampler near a top_p / inverse-CDF boundary may then pick another token: so
    for them only the first token, from a solo prefill, must match (it catches rows given another's seed)."""
    requests = []
    for i in range(16):
        prompt, _, stop, sampling = CASES[i % len(CASES)]
        requests.append(dict(model=NAME, prompt=prompt * (1 + i % 3), max_tokens=4 + (i * 7) % 30,
                             stop=list(stop) or None, stream=i % 2 == 1, **sampling))

    async def one(http: httpx.AsyncClient, body: dict) -> tuple[str, str]:
        if not body["stream"]:
            r = await http.post("/v1/completions", json=body)
            return r.json()["choices"][0]["text"], r.json()["choices"][0]["finish_reason"]
        text, reason = "", None
        async with http.stream("POST", "/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    c = json.loads(line[6:])["choices"][0]
                    text, reason = text + c["text"], c["finish_reason"] or reason
        return text, reason

    async def all_of_them():
        async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"},
                                     timeout=120) as http:
            return await asyncio.gather(*(one(http, b) for b in requests))

    got = asyncio.run(asyncio.wait_for(all_of_them(), 300))
    for body, (text, reason) in zip(requests, got, strict=True):
        sampling = {k: body[k] for k in ("temperature", "top_k", "top_p", "seed", "repetition_penalty") if k in body}
        want = solo_text(solo, body["prompt"], body["max_tokens"], body["stop"] or (), **sampling)
        if body.get("temperature") == 0:  # greedy: token for token, whatever the batch (docs/serving.md)
            assert text == want.text
            assert reason == ("length" if want.stop in ("max_new_tokens", "context") else "stop")
        else:  # sampled: the first token comes from the prompt's prefill, which runs alone, so it is the solo one
            first = min(len(solo.decode(want.ids[:1])), len(want.text))  # a stop string may cut it
            assert text[:first] == want.text[:first], (body, text, want.text)


def _wait_for(server, predicate, bound_s=60):
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        m = server.metrics()
        if predicate(m):
            return m
        time.sleep(0.05)
    raise AssertionError(f"metrics never got there: {m}")


def test_client_that_disconnects_frees_its_row(server):
    cancelled = 'gptedge_finished_requests_total{reason="cancelled"}'
    before = server.metrics().get(cancelled, 0)
    body = {"model": NAME, "prompt": "Hello", "max_tokens": CONTEXT - 10, "stream": True, "ignore_eos": True}
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{server.url}/v1/completions", json=body,
                         headers={"Authorization": f"Bearer {KEY}"}) as r:
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data: {"))  # it has started
    m = _wait_for(server, lambda m: m.get(cancelled, 0) == before + 1 and m["gptedge_running_batch_size"] == 0)
    assert m["gptedge_queue_depth"] == 0
    # the same with a whole (non-streamed) completion, abandoned by a client that times out
    with pytest.raises(httpx.TimeoutException):
        post(server, {**body, "stream": False}, timeout=httpx.Timeout(60, read=0.1))
    _wait_for(server, lambda m: m.get(cancelled, 0) == before + 2 and m["gptedge_running_batch_size"] == 0)


@pytest.mark.parametrize("body, param", [
    ({"n": 17}, "n"),
    ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": CONTEXT + 1}, "max_tokens"),
    ({"max_tokens": TOKENS_LIMIT + 1}, "max_tokens"),  # --max-tokens-limit
    ({"prompt": []}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": [50257]}, "prompt"),
    ({"stop": 3}, "stop"),
    ({"max_token": 5}, "max_token"),
    ({"best_of": 17}, "best_of"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
])
def test_bad_parameters_are_400(server, body, param):
    error = openai_error(post(server, {"model": NAME, "prompt": "Hi", **body}), 400)
    assert error["param"] == param and error["type"] == "invalid_request_error"


def test_error_paths(server, client, solo):
    too_long = solo.decode(solo.encode("one two three four " * 200)[:CONTEXT])
    error = openai_error(post(server, {"model": NAME, "prompt": too_long}), 400)
    assert error["param"] == "prompt" and error["code"] == "context_length_exceeded"
    assert openai_error(post(server, content=b"{not json", body=None), 400)["message"]
    assert openai_error(post(server, {"model": "gpt-4", "prompt": "Hi"}), 404)["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="Hi")
    with pytest.raises(openai.BadRequestError, match=r"n must be an integer 1\.\.16"):
        client.completions.create(model=NAME, prompt="Hi", n=17)
    for key in (None, "wrong"):
        assert openai_error(post(server, {"model": NAME, "prompt": "Hi"}, key=key), 401)["code"] == "invalid_api_key"
        assert httpx.get(f"{server.url}/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 401
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0, timeout=30) as bad_key:
        with pytest.raises(openai.AuthenticationError):
            bad_key.completions.create(model=NAME, prompt="Hi")
    assert openai_error(httpx.get(f"{server.url}/nowhere"), 404)


def test_queue_full_is_429_with_retry_after_and_rolls_back(server, client):
    # more prompts in one request than the queue and the batch hold: at most MAX_QUEUE wait and
    # MAX_BATCH + 1 leave the queue while the request submits them, none can finish that fast
    n = MAX_QUEUE + MAX_BATCH + 8
    body = {"model": NAME, "prompt": ["Hello"] * n, "max_tokens": 200, "ignore_eos": True}
    r = post(server, body)
    assert openai_error(r, 429)["code"] == "queue_full" and int(r.headers["Retry-After"]) >= 1
    _wait_for(server, lambda m: m["gptedge_queue_depth"] == 0 and m["gptedge_running_batch_size"] == 0)
    assert client.completions.create(model=NAME, prompt="Hi", max_tokens=3).choices[0].text is not None
    with pytest.raises(openai.RateLimitError):
        client.completions.create(model=NAME, prompt=["Hello"] * n, max_tokens=200, extra_body={"ignore_eos": True})


def test_health_models_and_metrics(server, client):
    assert httpx.get(f"{server.url}/health").json()["status"] == "ok"
    assert [m.id for m in client.models.list().data] == [NAME]
    assert client.models.retrieve(NAME).id == NAME
    text = httpx.get(f"{server.url}/metrics").text
    for name in ("gptedge_http_requests_total", "gptedge_queue_depth", "gptedge_running_batch_size",
                 "gptedge_prompt_tokens_total", "gptedge_generated_tokens_total",
                 "gptedge_time_to_first_token_seconds_bucket", "gptedge_inter_token_latency_seconds_bucket"):
        assert f"\n{name}" in text, name
    assert re.search(r'gptedge_http_requests_total\{path="/v1/completions",status="200"\} [1-9]', text)


@pytest.mark.slow  # a server of its own per grace, streams of up to 300 tokens
@pytest.mark.parametrize("grace", [30, 0])
def test_sigterm_drains_in_flight_requests_and_exits_zero(serve_model_dir, solo, tmp_path, grace):
    s = start_server(serve_model_dir, tmp_path / "serve.log", "--shutdown-timeout", str(grace))
    try:
        max_tokens = 60 if grace else 300  # a grace of 0 surely cuts 300 tokens short
        with openai.OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0, timeout=60) as client:
            stream = client.completions.create(model=NAME, prompt="Hello", max_tokens=max_tokens, temperature=0,
                                               stream=True, extra_body={"ignore_eos": True})
            chunks = iter(stream)
            text = next(chunks).choices[0].text
            s.proc.send_signal(signal.SIGTERM)
            if grace:
                for c in chunks:
                    text += c.choices[0].text
                assert text == solo_text(solo, "Hello", max_tokens, temperature=0, ignore_eos=True).text
                assert c.choices[0].finish_reason == "length"
            else:
                with pytest.raises(openai.APIError, match="shut down"):
                    for c in chunks:
                        text += c.choices[0].text
        assert s.proc.wait(60) == 0, s.log.read_text()
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{s.url}/health", timeout=5)
        assert "Traceback" not in s.log.read_text()
    finally:
        stop_server(s.proc)


def test_missing_serve_extra_is_a_one_line_hint(tmp_path):
    code = "import sys; sys.modules['uvicorn'] = None; from gptedge.cli import main; main(['serve', 'x'])"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 1 and "pip install 'gptedge[serve]'" in run.stderr and "Traceback" not in run.stderr
