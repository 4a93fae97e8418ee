"""`gptedge serve` against hostile clients, a real server in a subprocess on loopback: what one
client can cost is bounded (body size while reading, prompt bytes before tokenization, JSON depth, header and body
read timeouts), bad bytes are a 400 and never a 500 with a traceback, a client that leaves is counted as such,
SIGTERM ends within --shutdown-timeout with clients mid-body, and every bad serve option exits 2 with its range.
Every wait below is a bound (a socket timeout, a process wait), never a measured time."""

from __future__ import annotations

import json
import re
import select
import signal
import socket
import time
from urllib.parse import urlsplit

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from ..support.cli import error_line  # noqa: E402 - after the optional-dependency skips above
from ..support.openai_errors import openai_error  # noqa: E402 - after the optional-dependency skips above
from ..support.server import NAME, run_serve, start_server, stop_server  # noqa: E402 - after the optional-dependency skips above

pytestmark = pytest.mark.slow  # a real server, bounded waits for slow clients, serve's refusals in subprocesses

KEY = "hostile-test-key"
MAX_BODY = 262144
TIMEOUT_S = 1  # --header-timeout and --body-timeout of the module's server
BOUND_S = 15  # what a test waits at most for the server to act on a timeout of TIMEOUT_S
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT_BYTES_LIMIT = 128 * 128  # context 128 x GPT-2's longest token (128 bytes)


@pytest.fixture(scope="module", params=["httptools", "h11"])
def server(gpt2_model_dir, tmp_path_factory, request):
    """The server under each HTTP protocol `serve --http` takes: the limits are the same whichever parses."""
    s = start_server(gpt2_model_dir, tmp_path_factory.mktemp("hostile") / "serve.log", "--api-key", KEY,
                     "--max-body", str(MAX_BODY), "--header-timeout", str(TIMEOUT_S), "--body-timeout",
                     str(TIMEOUT_S), "--max-tokens-limit", "16", "--device", "cpu", "--http", request.param)
    s.http = request.param
    try:
        yield s
    finally:
        stop_server(s.proc)
    assert "Traceback" not in s.log.read_text(), s.log.read_text()


def metrics(server) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return {k: float(v) for k, v in re.findall(r"^(\S+) (\S+)$", text, re.M)}


def count(m: dict, status: int) -> float:
    return m.get(f'gptedge_http_requests_total{{path="/v1/completions",status="{status}"}}', 0)


def dropped(m: dict, reason: str) -> float:
    return m[f'gptedge_http_dropped_total{{reason="{reason}"}}']


def post_raw(server, body: bytes, timeout: float = 30) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/completions", content=body,
                      headers={**AUTH, "Content-Type": "application/json"}, timeout=timeout)


def connect(server) -> socket.socket:
    url = urlsplit(server.url)
    sock = socket.create_connection((url.hostname, url.port), timeout=BOUND_S)
    return sock


def request_head(length: int | str, extra: str = "") -> bytes:
    return (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n{extra}\r\n").encode()


def read_status(sock: socket.socket) -> int | None:
    """The status of the response the server sends, or None when it closes the connection without one."""
    data = b""
    try:
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                return None
            data += chunk
    except ConnectionResetError:
        return None
    return int(data.split(b" ", 2)[1])


def test_a_body_over_max_body_is_refused_while_reading(server):
    before = metrics(server)
    with connect(server) as sock:  # declared too large: refused before a byte of it is read
        sock.sendall(request_head(50 * 10**6))
        assert read_status(sock) == 413
    with connect(server) as sock:  # chunked, growing past the limit: refused once it does
        sock.sendall(request_head(0).replace(b"Content-Length: 0", b"Transfer-Encoding: chunked"))
        status, sent = None, 0
        while status is None and sent < 40 * MAX_BODY:
            try:
                sock.sendall(b"4000\r\n" + b" " * 0x4000 + b"\r\n")
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += 0x4000
            if select.select([sock], [], [], 0)[0]:  # the server answered: read it
                status = read_status(sock)
        # the server answered 413 and closed; the kernel may reset the connection (unread bytes) before the client
        # reads the answer. Either way it stopped reading long before the client stopped sending.
        assert status in (413, None) and sent < 40 * MAX_BODY
    after = metrics(server)
    assert dropped(after, "body_too_large") >= dropped(before, "body_too_large") + 2
    assert count(after, 500) == 0 and httpx.get(f"{server.url}/health").status_code == 200


def test_a_prompt_too_long_for_any_tokenization_is_refused_before_tokenizing(server):
    before = metrics(server)
    r = post_raw(server, json.dumps({"model": NAME, "prompt": "a" * (PROMPT_BYTES_LIMIT + 1)}).encode())
    e = openai_error(r, 400)
    assert e["code"] == "context_length_exceeded" and e["param"] == "prompt"
    assert f"the prompt is {PROMPT_BYTES_LIMIT + 1:,} bytes; no text over {PROMPT_BYTES_LIMIT:,} bytes" in e["message"]
    assert metrics(server)["gptedge_prompt_tokens_total"] == before["gptedge_prompt_tokens_total"]
    # under the byte bound but over the context in tokens: tokenized, then refused as before
    e = openai_error(post_raw(server, json.dumps({"model": NAME, "prompt": "one two " * 100}).encode()), 400)
    assert e["code"] == "context_length_exceeded" and "tokens" in e["message"]


@pytest.mark.parametrize("depth", [33, 100_000])
def test_deep_json_is_400(server, depth):
    e = openai_error(post_raw(server, b"[" * depth + b"]" * depth), 400)
    assert f"nests {depth} levels deep; at most 32" in e["message"]


def test_nesting_within_the_limit_still_works(server):
    r = post_raw(server, json.dumps({"model": NAME, "prompt": [[15496, 995]], "max_tokens": 2}).encode())
    assert r.status_code == 200 and len(r.json()["choices"]) == 1


@pytest.mark.parametrize("raw, param", [
    (b'{"model": "tiny", "prompt": "\\ud800abc"}', "prompt"),
    (b'{"model": "tiny", "prompt": ["ok", "x\\udfff"]}', "prompt"),
    (b'{"model": "tiny", "prompt": "Hi", "stop": ["\\udc80"]}', "stop"),
    (b'{"model": "\\ud800", "prompt": "Hi"}', "model"),
    (b'{"model": "tiny", "prompt": "Hi", "\\udbff": 1}', "\\udbff"),
    (b'{"model": "tiny", "prompt": "Hi", "user": "\\ud83d"}', "user"),
])
def test_lone_surrogates_are_400(server, raw, param):
    e = openai_error(post_raw(server, raw), 400)
    assert "lone surrogate" in e["message"] and e["param"] == param


def test_a_surrogate_pair_is_text(server):
    r = post_raw(server, json.dumps({"model": NAME, "prompt": "\U0001F600 smile", "max_tokens": 2}).encode())
    assert r.status_code == 200


def test_a_client_that_leaves_mid_body_is_counted_not_a_500(server):
    before = metrics(server)
    with connect(server) as sock:
        sock.sendall(request_head(1000) + b'{"model": "tiny", "pro')
        time.sleep(0.2)
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline and count(metrics(server), 499) == count(before, 499):
        time.sleep(0.05)
    after = metrics(server)
    assert count(after, 499) == count(before, 499) + 1
    assert dropped(after, "client_disconnect") == dropped(before, "client_disconnect") + 1
    assert count(after, 500) == 0


def test_slow_headers_are_dropped(server):
    before = metrics(server)
    with connect(server) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        closed = False
        deadline = time.monotonic() + BOUND_S
        while time.monotonic() < deadline:  # one more header line each 0.2 s: never complete
            try:
                sock.sendall(b"X-Slow: 1\r\n")
                sock.settimeout(0.2)
                if sock.recv(1) == b"":
                    closed = True
                    break
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
        assert closed
    assert dropped(metrics(server), "header_timeout") == dropped(before, "header_timeout") + 1


def test_headers_past_the_cap_close_the_connection(server):
    """A request whose headers never end, sent fast: the connection is closed at the header cap (gptedge's 64 KiB
    under httptools, counted; h11's own 16 KiB, a 400), well before the header timeout; the server serves on."""
    before = metrics(server)
    with connect(server) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        line = b"X-Big: " + b"a" * 1017 + b"\r\n"  # 1 KiB
        try:
            for _ in range(80):  # 80 KiB, never the blank line that ends the headers
                sock.sendall(line)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert read_status(sock) in (None, 400, 431)
        sock.settimeout(TIMEOUT_S / 2)  # closed, not waiting for the header timeout (a timeout here fails)
        try:
            while sock.recv(65536):  # the rest of the response, then the close
                pass
        except ConnectionResetError:
            pass
    after = metrics(server)
    if server.http == "httptools":
        assert dropped(after, "header_too_large") == dropped(before, "header_too_large") + 1
    assert dropped(after, "header_timeout") == dropped(before, "header_timeout")
    assert post_raw(server, json.dumps({"model": NAME, "prompt": "hi", "max_tokens": 1}).encode()).status_code == 200


def test_a_slow_body_gets_408(server):
    before = metrics(server)
    with connect(server) as sock:
        sock.sendall(request_head(100) + b"{")
        assert read_status(sock) == 408
    after = metrics(server)
    assert dropped(after, "body_timeout") == dropped(before, "body_timeout") + 1 and count(after, 408) >= 1


def test_sigterm_ends_within_the_shutdown_timeout_with_clients_mid_body(gpt2_model_dir, tmp_path):
    grace = 1
    s = start_server(gpt2_model_dir, tmp_path / "serve.log", "--shutdown-timeout", str(grace), "--body-timeout", "600",
                     "--device", "cpu")
    socks = []
    try:
        for _ in range(3):
            sock = connect(s)
            sock.sendall(request_head(1000).replace(f"Authorization: Bearer {KEY}\r\n".encode(), b"") + b"{")
            socks.append(sock)
        time.sleep(0.3)
        s.proc.send_signal(signal.SIGTERM)
        # the server does not wait for these bodies: it exits within the grace period, not grace + 5 s
        assert s.proc.wait(grace + 3) == 0, s.log.read_text()
        for sock in socks:
            assert read_status(sock) in (503, None)
        assert "Traceback" not in s.log.read_text()
    finally:
        for sock in socks:
            sock.close()
        stop_server(s.proc)


# --- the command line ------------------------------------------------------------------------------------------


BAD_OPTIONS = [
    (["--api-key", "clé"], "must be printable ASCII (0x20..0x7e); it holds 'é'"),
    (["--api-key", " sp "], "must not begin or end with a space"),
    (["--api-key", "tab\there"], "must be printable ASCII"),
    (["--max-batch", "0"], "'--max-batch': 0 is not in the range 1<=x<=256"),
    (["--max-queue", "0"], "'--max-queue': 0 is not in the range 1<=x<=100000"),
    (["--prefill-budget", "0"], "'--prefill-budget': 0 is not in the range 1<=x<=8192"),
    (["--prefill-hold-ms", "nan"], "'--prefill-hold-ms': nan is not in the range 0<=x<=1000 (milliseconds)"),
    (["--prefill-hold-ms", "-1"], "'--prefill-hold-ms': -1 is not in the range 0<=x<=1000"),
    (["--threads", "100"], "'--threads': 100 is not in the range 1<=x<="),
    (["--device", "foo"], "'foo' is not one of 'cpu', 'cuda', 'auto'"),
    (["--port", "70000"], "'--port': 70000 is not in the range 0<=x<=65535"),
    (["--shutdown-timeout", "nan"], "'--shutdown-timeout': nan is not in the range 0<=x<=3600 (seconds)"),
    (["--shutdown-timeout", "inf"], "inf is not in the range 0<=x<=3600"),
    (["--shutdown-timeout", "-1"], "-1 is not in the range 0<=x<=3600"),
    (["--max-body", "10"], "'--max-body': 10 is not in the range 1024<=x<=1073741824"),
    (["--header-timeout", "0"], "'--header-timeout': 0 is not in the range 0.1<=x<=3600"),
    (["--body-timeout", "nan"], "'--body-timeout': nan is not in the range"),
    (["--max-tokens-limit", "0"], "'--max-tokens-limit': 0 is not in the range x>=1"),
    (["--max-tokens-limit", "500"], "'--max-tokens-limit': 500 is not in the range 1<=x<=128 (the model's context)"),
    (["--model-name", ""], "'--model-name': must be 1..256 printable characters"),
    (["--max-rows", "0"], "'--max-rows': 0 is not in the range 1<=x<=1024"),
    (["--max-examples", "0"], "'--max-examples': 0 is not in the range 1<=x<=100000"),
    (["--batch-wait", "61"], "'--batch-wait': 61 is not in the range 0<=x<=60 (seconds)"),
    (["--batch-wait", "nan"], "'--batch-wait': nan is not in the range 0<=x<=60"),
]


@pytest.mark.parametrize("args, says", BAD_OPTIONS, ids=[" ".join(a) for a, _ in BAD_OPTIONS])
def test_bad_serve_options_exit_2_with_their_range(gpt2_model_dir, args, says):
    result = run_serve(gpt2_model_dir, *args)
    assert result.returncode == 2, result.stderr
    assert says in error_line(result)


def test_an_api_key_from_the_environment_is_checked_too(gpt2_model_dir):
    result = run_serve(gpt2_model_dir, env={"GPTEDGE_API_KEY": "ключ"})
    assert result.returncode == 2 and "must be printable ASCII" in error_line(result)


def chunked_post(server, body: bytes) -> httpx.Response:
    """POST `body` with Transfer-Encoding: chunked (httpx sends a generator's pieces as chunks, no Content-Length)."""
    pieces = (body[i:i + 0x4000] for i in range(0, len(body), 0x4000))
    return httpx.post(f"{server.url}/v1/completions", content=pieces,
                      headers={**AUTH, "Content-Type": "application/json"}, timeout=30)


@pytest.mark.parametrize("extra, status", [(0, 200), (1, 413)])
def test_a_chunked_body_exactly_at_max_body_is_served_one_byte_more_is_413_and_counted(server, extra, status):
    body = json.dumps({"model": NAME, "prompt": "Hi", "max_tokens": 1}).encode()
    body += b" " * (MAX_BODY + extra - len(body))  # trailing whitespace: the same JSON, MAX_BODY + extra bytes
    before = count(metrics(server), 413)
    response = chunked_post(server, body)
    assert response.status_code == status, response.text
    if status == 413:
        assert openai_error(response, 413)["code"] == "request_too_large"
    assert count(metrics(server), 413) == before + (status == 413)
