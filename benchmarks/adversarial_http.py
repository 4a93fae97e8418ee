"""The adversarial pass's server and Python API cases (adversarial.py runs them). HTTP cases go to a real
`gptedge serve` of the tiny GPT-2 (or of the Llama sample, for chat): a refusal is a 4xx in OpenAI's error shape,
a served request is checked against the Python API's own result on the same dir (greedy text, echo, logprobs)."""

from __future__ import annotations

import json
import math
import threading

import numpy as np

from adversarial import Case, Outcome, judge_http

C, CHAT = "/v1/completions", "/v1/chat/completions"


def http(cid: str, body, statuses=(400,), path: str = C, oracle=None, server: str = "gpt2", headers=None,
         method: str = "POST") -> Case:
    expect = "ok" if statuses == "ok" else "4xx"
    return Case(f"http-{cid}", "serve", "http", (method, path, body), expect, oracle,
                statuses=() if statuses == "ok" else tuple(statuses),
                extra={"server": server, "headers": headers or {}})


def body(**fields) -> dict:
    return {"model": "tiny", "prompt": "It is a truth", "max_tokens": 4, **fields}


# -- oracles -------------------------------------------------------------------------------------------------------
def greedy_text(prompt: str, n: int, model: str = "lm"):
    def check(response, ctx):
        want = ctx.model(model).generate(prompt, max_new_tokens=n, greedy=True).text
        got = response.json()["choices"][0]["text"]
        return None if got == want else f"{got!r} != API {want!r}"
    return check


def echo_prefix(prompt: str):
    def check(response, ctx):
        choice = response.json()["choices"][0]
        return None if choice["text"].startswith(prompt) else f"echo lost the prompt: {choice['text'][:60]!r}"
    return check


def logprobs_shape(n_top: int, tokens: int):
    def check(response, ctx):
        lp = response.json()["choices"][0]["logprobs"]
        if len(lp["tokens"]) != tokens or len(lp["token_logprobs"]) != tokens:
            return f"{len(lp['tokens'])} tokens, want {tokens}"
        bad = [x for x in lp["token_logprobs"] if x is not None and not (x <= 0 and math.isfinite(x))]
        tops = lp.get("top_logprobs") or []
        if bad or any(t is not None and len(t) > n_top for t in tops):
            return f"logprobs out of range: {bad[:3]} / tops {[len(t or {}) for t in tops][:4]}"
        return None
    return check


def choices(n: int):
    def check(response, ctx):
        got = response.json()["choices"]
        return None if len(got) == n and sorted(c["index"] for c in got) == list(range(n)) else f"{len(got)} choices"
    return check


def default_max_tokens_within_limit(response, ctx):
    usage = response.json()["usage"]
    return None if usage["completion_tokens"] <= 64 else f"{usage['completion_tokens']} tokens past the limit 64"


def json_value(want=dict):
    """The text is JSON of type `want` (object), or any JSON value (want None: the empty schema {}), unless it was
    cut at max_tokens."""
    def check(response, ctx):
        choice = response.json()["choices"][0]
        try:
            value = json.loads(choice["text"])
        except ValueError:
            return None if choice["finish_reason"] == "length" else f"not JSON: {choice['text'][:60]!r}"
        return None if want is None or isinstance(value, want) else f"not an object: {choice['text'][:60]!r}"
    return check


def concurrent_cancel(server, ctx, case) -> Outcome:
    """Ten streaming requests dropped after their first bytes, at once; then the server still answers a greedy
    request exactly as the API does."""
    import httpx

    def drop():
        with httpx.stream("POST", f"{server.url}{C}", json=body(max_tokens=60, stream=True), timeout=30) as r:
            for _ in r.iter_bytes():
                break
    threads = [threading.Thread(target=drop) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    response = httpx.post(f"{server.url}{C}", json=body(temperature=0), timeout=60)
    return judge_http(case, response, ctx)


def http_cases() -> list[Case]:
    c = [
        http("malformed-json", b"{nope"), http("empty-body", b""), http("json-array", b"[1, 2]"),
        http("json-string", b'"hi"'), http("json-null", b"null"), http("not-utf8", b'{"prompt": "\xff"}'),
        http("nan-literal", b'{"model": "tiny", "prompt": "a", "temperature": NaN}'),
        http("deep-json", b"[" * 10000 + b"]" * 10000), http("duplicate-keys",
                                                               b'{"model":"tiny","prompt":"a","prompt":5}'),
        http("lone-surrogate", b'{"model": "tiny", "prompt": "\\ud800"}'),
        http("body-over-max", body(prompt="a" * 70000), (413,)),
        http("unknown-field", body(frobnicate=1)), http("misspelt-field", body(max_token=3)),
        http("model-unknown", body(model="gpt-4"), (404,)), http("model-not-string", body(model=5)),
        http("prompt-missing", {"model": "tiny"}), http("prompt-null", body(prompt=None)),
        http("prompt-empty-string", body(prompt="")), http("prompt-empty-list", body(prompt=[])),
        http("prompt-list-empty-string", body(prompt=[""])), http("prompt-int", body(prompt=5)),
        http("prompt-dict", body(prompt={"a": 1})), http("prompt-ids-negative", body(prompt=[-1])),
        http("prompt-ids-past-vocab", body(prompt=[50257])), http("prompt-ids-float", body(prompt=[1.5])),
        http("prompt-ids-bool", body(prompt=[True])), http("prompt-ids-huge", body(prompt=[10**30])),
        http("prompt-mixed-list", body(prompt=["a", 1])), http("prompt-past-context", body(prompt="word " * 300)),
        http("prompt-exactly-context", body(prompt=[198] * 128)),
        http("max-tokens-0", body(max_tokens=0)), http("max-tokens-negative", body(max_tokens=-1)),
        http("max-tokens-float", body(max_tokens=2.5)), http("max-tokens-string", body(max_tokens="4")),
        http("max-tokens-bool", body(max_tokens=True)), http("max-tokens-huge", body(max_tokens=10**30)),
        http("max-tokens-over-limit", body(max_tokens=65)),
        http("temperature-negative", body(temperature=-1)), http("temperature-string", body(temperature="hot")),
        http("temperature-huge", body(temperature=1e309)),
        http("top-p-0", body(top_p=0)), http("top-p-2", body(top_p=2)), http("top-k-negative", body(top_k=-1)),
        http("top-k-float", body(top_k=1.5)), http("seed-negative", body(seed=-1)), http("seed-string", body(seed="1")),
        http("seed-huge-ok", body(seed=2**70, max_tokens=2), "ok"),  # any integer seeds numpy's generator
        http("repetition-penalty-0", body(repetition_penalty=0)), http("ignore-eos-string", body(ignore_eos="yes")),
        http("n-0", body(n=0)), http("n-17", body(n=17)), http("n-float", body(n=1.5)),
        http("best-of-less-than-n", body(n=3, best_of=2)), http("best-of-with-stream", body(best_of=2, stream=True)),
        http("logprobs-21", body(logprobs=21)), http("logprobs-negative", body(logprobs=-1)),
        http("logprobs-bool", body(logprobs=True)),
        http("stop-empty-string", body(stop="")), http("stop-empty-in-list", body(stop=["x", ""])),
        http("stop-17", body(stop=["x"] * 17)), http("stop-int", body(stop=5)),
        http("stop-list-of-ints", body(stop=[1])),
        http("stream-string", body(stream="yes")), http("stream-options-without-stream",
                                                        body(stream_options={"include_usage": True})),
        http("suffix", body(suffix="end")), http("logit-bias-bad", body(logit_bias={"x": 1})),
        http("presence-penalty-out", body(presence_penalty=5)),
        http("response-format-unknown", body(response_format={"type": "xml"})),
        http("response-format-not-object", body(response_format="json")),
        http("response-format-schema-missing", body(response_format={"type": "json_schema"})),
        http("response-format-schema-bad-ref", body(response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"$ref": "#/nope"}}})),
        http("response-format-schema-not-object", body(response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": 5}})),
        http("regex-bad", body(regex="(")), http("regex-and-grammar", body(regex="a", grammar="root ::= \"a\"")),
        http("grammar-bad", body(grammar="root ::= (")),
        http("get-completions", None, (405,), method="GET"),
        http("unknown-route", body(), (404,), path="/v1/nope"),
        http("classify-on-lm-server", {"model": "tiny", "input": ["a"]}, (400, 404), path="/v1/classify"),
        # chat
        http("chat-no-messages", {"model": "tiny"}, path=CHAT, server="llama"),
        http("chat-empty-messages", {"model": "tiny", "messages": []}, path=CHAT, server="llama"),
        http("chat-bad-role", {"model": "tiny", "messages": [{"role": "wizard", "content": "hi"}]}, path=CHAT,
             server="llama"),
        http("chat-role-missing", {"model": "tiny", "messages": [{"content": "hi"}]}, path=CHAT, server="llama"),
        http("chat-content-int", {"model": "tiny", "messages": [{"role": "user", "content": 5}]}, path=CHAT,
             server="llama"),
        http("chat-message-string", {"model": "tiny", "messages": ["hi"]}, path=CHAT, server="llama"),
        http("chat-unknown-field", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "x": 1},
             path=CHAT, server="llama"),
        http("chat-prompt-field", {"model": "tiny", "prompt": "hi"}, path=CHAT, server="llama"),
        http("chat-echo", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "echo": True},
             path=CHAT, server="llama"),
        http("chat-tool-role-bad-content", {"model": "tiny", "messages": [{"role": "tool"}]}, path=CHAT,
             server="llama"),
        http("chat-on-gpt2-without-template", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
             (400, 404), path=CHAT),
        # served, checked against the API
        http("greedy-oracle", body(temperature=0), "ok", oracle=greedy_text("It is a truth", 4)),
        http("greedy-top-k-1-oracle", body(top_k=1), "ok", oracle=greedy_text("It is a truth", 4)),
        http("unicode-prompt-oracle", body(prompt="naïve 日本 🙂", temperature=0), "ok",
             oracle=greedy_text("naïve 日本 🙂", 4)),
        http("no-max-tokens-on-limited-server", {"model": "tiny", "prompt": "Hi"}, "ok",
             oracle=default_max_tokens_within_limit),
        http("max-tokens-at-limit", body(max_tokens=64, ignore_eos=True), "ok",
             oracle=lambda r, ctx: None if r.json()["usage"]["completion_tokens"] == 64 else "not 64 tokens"),
        http("max-tokens-past-context-stops", body(prompt=[198] * 120, max_tokens=64, ignore_eos=True), "ok",
             oracle=lambda r, ctx: None if r.json()["usage"]["completion_tokens"] == 8 else str(r.json()["usage"])),
        http("echo-oracle", body(echo=True, max_tokens=2), "ok", oracle=echo_prefix("It is a truth")),
        http("echo-max-tokens-0-scores-the-prompt", body(echo=True, max_tokens=0, logprobs=1), "ok",
             oracle=lambda r, ctx: None if r.json()["choices"][0]["text"] == "It is a truth" else r.text[:100]),
        http("logprobs-5-oracle", body(logprobs=5, max_tokens=3, ignore_eos=True), "ok", oracle=logprobs_shape(5, 3)),
        http("logprobs-0-oracle", body(logprobs=0, max_tokens=3, ignore_eos=True), "ok", oracle=logprobs_shape(0, 3)),
        http("echo-logprobs-oracle", body(echo=True, logprobs=2, max_tokens=2, ignore_eos=True), "ok",
             oracle=logprobs_shape(2, 4 + 2)),
        http("n-3", body(n=3, seed=1), "ok", oracle=choices(3)),
        http("best-of-3-n-2", body(n=2, best_of=3, seed=1), "ok", oracle=choices(2)),
        http("prompt-list-of-2", body(prompt=["a", "b"], temperature=0), "ok", oracle=choices(2)),
        http("stop-list-ok", body(stop=["\n", "the"], max_tokens=16), "ok",
             oracle=lambda r, ctx: None if not any(s in r.json()["choices"][0]["text"] for s in ("\n", "the"))
             else "a stop string in the text"),
        http("response-format-json-object", body(response_format={"type": "json_object"}, max_tokens=32), "ok",
             oracle=json_value(dict)),
        http("response-format-empty-schema", body(response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": {}}}, max_tokens=32), "ok", oracle=json_value(None)),
        http("chat-ok-llama", {"model": "tiny", "messages": [{"role": "system", "content": "Be brief."},
                                                             {"role": "user", "content": "Hi"}], "max_tokens": 4},
             "ok", path=CHAT, server="llama"),
        http("models-list", None, "ok", path="/v1/models", method="GET",
             oracle=lambda r, ctx: None if r.json()["data"][0]["id"] == "tiny" else r.text[:80]),
        Case("concurrent-cancel-then-greedy", "serve", "http", ("POST", C, concurrent_cancel), "ok",
             greedy_text("It is a truth", 4), extra={"server": "gpt2"}),
    ]
    return c


# -- the Python API ------------------------------------------------------------------------------------------------
def api(cid: str, call, expect: str = "raises", oracle=None) -> Case:
    return Case(f"api-{cid}", "api", "api", call, expect, oracle)


def lm(ctx):
    return ctx.model("lm")


def api_cases() -> list[Case]:
    from gptedge.runtime import SessionConfig, load, load_classifier

    g = lambda **kw: lambda ctx: lm(ctx).generate("Hi", **kw)  # noqa: E731 - one case a line below
    c = [
        api("load-int", lambda ctx: load(5)), api("load-missing", lambda ctx: load(ctx.paths["missing"])),
        api("load-file", lambda ctx: load(ctx.paths["text"])),
        api("load-classifier", lambda ctx: load(ctx.paths["cls"])),
        api("load-device-tpu", lambda ctx: load(ctx.paths["lm"], device="tpu")),
        api("load-session-dict", lambda ctx: load(ctx.paths["lm"], session={"threads": 1})),
        api("load-threads-0", lambda ctx: load(ctx.paths["lm"], session=SessionConfig(threads=0))),
        api("load-classifier-lm", lambda ctx: load_classifier(ctx.paths["lm"])),
        api("max-new-tokens-True", g(max_new_tokens=True)), api("max-new-tokens-0", g(max_new_tokens=0)),
        api("max-new-tokens-float", g(max_new_tokens=2.0)), api("max-new-tokens-str", g(max_new_tokens="2")),
        api("max-new-tokens-None", g(max_new_tokens=None)),
        api("max-new-tokens-np-bool", g(max_new_tokens=np.bool_(1))),
        api("max-new-tokens-np-int64", g(max_new_tokens=np.int64(2)), "ok",
            lambda r, ctx: None if len(r.ids) <= 2 else f"{len(r.ids)} ids"),
        api("max-new-tokens-huge-kvb", lambda ctx: ctx.model("kvb").generate("Hi", max_new_tokens=10**9,
                                                                           ignore_eos=True), "ok",
            lambda r, ctx: None if r.stop == "context" and len(r.prompt_ids) + len(r.ids) == 128 else r.stop),
        api("prompt-None", lambda ctx: lm(ctx).generate(None)),
        api("prompt-bytes", lambda ctx: lm(ctx).generate(b"Hi")),
        api("prompt-empty", lambda ctx: lm(ctx).generate("")),
        api("prompt-ids-empty", lambda ctx: lm(ctx).generate([])),
        api("prompt-surrogate", lambda ctx: lm(ctx).generate("\ud800")),
        api("prompt-ids-negative", lambda ctx: lm(ctx).generate([-1])),
        api("prompt-ids-float", lambda ctx: lm(ctx).generate([1.0])),
        api("prompt-past-context", lambda ctx: lm(ctx).generate([1] * 128)),
        api("prompt-np-array-ok", lambda ctx: lm(ctx).generate(np.array([1, 2, 3]), max_new_tokens=2), "ok"),
        api("stop-str", g(stop="x")), api("stop-empty", g(stop=[""])), api("stop-int-list", g(stop=[1])),
        api("temperature-negative", g(temperature=-1)), api("temperature-nan", g(temperature=float("nan"))),
        api("top-k-True", g(top_k=True)), api("top-k-float", g(top_k=1.5)), api("top-p-0", g(top_p=0)),
        api("seed-True", g(seed=True)), api("seed-negative", g(seed=-1)),
        api("seed-np-int-ok", g(seed=np.int64(3), max_new_tokens=2), "ok"),
        api("unknown-option", g(topk=3)), api("sampling-and-fields", lambda ctx: lm(ctx).generate(
            "Hi", sampling=object())),
        api("prefill-chunk-0", g(prefill_chunk=0)), api("prefill-chunk-True", g(prefill_chunk=True)),
        api("ignore-eos-str", g(ignore_eos="no")),
        api("batch-str", lambda ctx: lm(ctx).generate_batch("Hi")),
        api("batch-empty", lambda ctx: lm(ctx).generate_batch([])),
        api("batch-ok-oracle", lambda ctx: lm(ctx).generate_batch(["Hi", "It is a truth"], max_new_tokens=3,
                                                                  greedy=True), "ok",
            lambda r, ctx: None if [x.ids for x in r] == [lm(ctx).generate(p, max_new_tokens=3, greedy=True).ids
                                                        for p in ("Hi", "It is a truth")] else "batch != one by one"),
        api("beam-num-beams-0", lambda ctx: lm(ctx).beam_search(["Hi"], num_beams=0)),
        api("beam-return-more", lambda ctx: lm(ctx).beam_search(["Hi"], num_beams=2, num_return_sequences=3)),
        api("beam-str", lambda ctx: lm(ctx).beam_search("Hi")),
        api("beam-np-ints-ok", lambda ctx: lm(ctx).beam_search(["Hi"], max_new_tokens=np.int64(2),
                                                               num_beams=np.int32(2)), "ok"),
        api("decode-negative", lambda ctx: lm(ctx).decode([-1])),
        api("decode-str", lambda ctx: lm(ctx).decode("ab")),
        api("decode-past-vocab", lambda ctx: lm(ctx).decode([50257])),
        api("encode-bytes", lambda ctx: lm(ctx).encode(b"x")),
        api("round-trip-oracle", lambda ctx: lm(ctx).decode(lm(ctx).encode("naïve — 日本 🙂 \u2028")), "ok",
            lambda r, ctx: None if r == "naïve — 日本 🙂 \u2028" else repr(r)),
        api("stream-ok-oracle", lambda ctx: "".join(lm(ctx).stream("Hi", max_new_tokens=4, greedy=True)), "ok",
            lambda r, ctx: None if r == lm(ctx).generate("Hi", max_new_tokens=4, greedy=True).text else repr(r)),
        api("classify-str", lambda ctx: load_classifier(ctx.paths["cls"]).classify("a")),
        api("classify-empty-pair", lambda ctx: load_classifier(ctx.paths["cls"]).classify([("", "")])),
        api("classify-batch-True", lambda ctx: load_classifier(ctx.paths["cls"]).classify([("a", "b")],
                                                                                          batch_size=True)),
    ]
    return c
