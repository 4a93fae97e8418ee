"""Property: whatever body a client posts to /v1/completions, the server answers it without a 500, logs no
traceback, and still serves /health afterwards. Hypothesis generates 2,000 bodies: JSON values
of every shape, completion requests with fields of every type, and raw bytes (invalid UTF-8, lone surrogate
escapes, truncated and deeply nested JSON). One real server in a subprocess; --max-tokens-limit 2 keeps the
bodies that are valid requests cheap."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx")
hypothesis = pytest.importorskip("hypothesis")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from hypothesis import HealthCheck, given, settings  # noqa: E402 - after the optional-dependency skips above
from hypothesis import strategies as st  # noqa: E402 - after the optional-dependency skips above

from ..support.server import NAME, start_server, stop_server  # noqa: E402 - after the optional-dependency skips above

pytestmark = pytest.mark.slow  # 2,000 generated bodies against a real server

KEY = "fuzz-key"
BODIES = 2000
ALLOWED = {200, 400, 404, 413, 429}  # 429: valid requests may pile up behind each other

scalars = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True) | st.text(max_size=40)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=20)
FIELDS = ["model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "stream", "logprobs",
          "echo", "n", "best_of", "stream_options", "repetition_penalty", "ignore_eos", "user", "suffix", "logit_bias"]
field_values = (json_values | st.just(NAME) | st.integers(0, 50256) | st.lists(st.integers(-5, 60000), max_size=6)
                | st.lists(st.lists(st.integers(0, 50256), max_size=4), max_size=3) | st.floats(0, 2))
requests = st.fixed_dictionaries({"model": st.just(NAME) | st.text(max_size=8), "prompt": field_values},
                                 optional={k: field_values for k in FIELDS if k not in ("model", "prompt")})


valid_requests = st.fixed_dictionaries(  # mostly well-formed: the generation path runs too
    {"model": st.just(NAME), "prompt": st.text(min_size=1, max_size=20) | st.lists(st.integers(0, 50256), min_size=1,
                                                                               max_size=5),
     "max_tokens": st.integers(1, 2)},
    optional={"temperature": st.floats(0, 2), "top_k": st.integers(0, 50), "top_p": st.floats(0.01, 1),
              "seed": st.integers(0, 2**31), "stop": st.lists(st.text(min_size=1, max_size=3), max_size=2),
              "stream": st.booleans(), "echo": st.booleans(), "ignore_eos": st.booleans()})


def _surrogates(text: str) -> bytes:
    """A JSON body whose prompt holds escapes of lone surrogates (json.dumps never writes them by itself)."""
    text = text.replace('"', "").replace("\\", "")
    return ('{"model": "%s", "prompt": "%s\\ud800", "max_tokens": 1}' % (NAME, text)).encode()


raw_bodies = (st.binary(max_size=200)
              | st.text(max_size=30).map(_surrogates)
              | st.integers(1, 3000).map(lambda n: b"[" * n)
              | st.integers(1, 3000).map(lambda n: b'{"model": "tiny", "prompt": ' + b"[" * n + b"1" + b"]" * n + b"}")
              | st.builds(lambda b, cut: b[:cut], requests.map(lambda r: json.dumps(r).encode()), st.integers(0, 80)))
bodies = (json_values.map(lambda v: json.dumps(v).encode()) | requests.map(lambda r: json.dumps(r).encode())
          | valid_requests.map(lambda r: json.dumps(r).encode()) | raw_bodies)


@pytest.fixture(scope="module")
def server(gpt2_model_dir, tmp_path_factory):
    s = start_server(gpt2_model_dir, tmp_path_factory.mktemp("fuzz") / "serve.log", "--api-key", KEY,
                     "--max-tokens-limit", "2", "--max-body", "65536", "--device", "cpu")
    try:
        yield s
    finally:
        stop_server(s.proc)


@pytest.fixture(scope="module")
def client(server):
    limits = httpx.Limits(max_connections=8, max_keepalive_connections=8)
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60, limits=limits) as c:
        yield c


statuses: dict[int, int] = {}
PER_EXAMPLE = 50  # bodies posted at once by 8 clients: loopback round trips overlap, the run stays short


@settings(max_examples=BODIES // PER_EXAMPLE, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(batch=st.lists(bodies, min_size=PER_EXAMPLE, max_size=PER_EXAMPLE))
def test_no_body_makes_a_500(client, batch):
    def post(body: bytes) -> tuple[bytes, httpx.Response]:
        return body, client.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(post, batch))
    for body, r in answers:
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        assert r.status_code in ALLOWED, (body[:200], r.status_code, r.text[:300])
        if r.status_code != 200:
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_the_server_survived_the_fuzzing(server, client):
    """Runs after the property (file order): the server is alive, served every body, and logged no traceback."""
    assert sum(statuses.values()) >= BODIES, statuses
    assert statuses.get(200, 0) > 0 and statuses.get(400, 0) > 0, statuses  # both paths were exercised
    assert httpx.get(f"{server.url}/health", timeout=10).json()["status"] == "ok"
    log = server.log.read_text()
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-3000:]
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    assert 'status="500"' not in text
