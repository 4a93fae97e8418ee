"""gptedge on a real Ray cluster: a head and a second node as separate `ray start` processes on loopback (1 CPU and a
custom resource each), the shipped deploy/ray-serve.yaml deployed with `serve run`, requests through Ray's HTTP proxy.

Completions equal generate()'s on both replicas, one per node; errors, /v1/models and /health are those of
`gptedge serve`'s app; a replica killed mid-load fails only its own requests, cleanly, and Ray replaces it; the
`serve run MODULE:app key=value` form works; autoscaling adds a replica under load and removes it when idle.
Every Ray process is killed at the end (LocalCluster.stop), also when a test fails. No timing assertions: waits
are bounds."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections import Counter

import pytest

ray = pytest.importorskip("ray", reason="the [ray] extra is not installed")
pytest.importorskip("ray.serve", reason="the [ray] extra is not installed")
httpx = pytest.importorskip("httpx")

from ..support.ray_cluster import (KEY, NAME, PINNED, SLOT, Answer, app_running, client, complete, config_from_yaml,  # noqa: E402 - after the optional-dependency skips above
                          delete_app, deploy_config, replica_states, serve_run, wait_for)

pytestmark = pytest.mark.ray

CONTEXT = 256
MAIN = "gptedge"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The tiny seeded GPT-2 of conftest as a kv_buffer graph (unvalidated: test_export checks exports)."""
    from gptedge.export.exporter import export_checkpoint

    from ..support.checkpoints import tiny_reference, write_checkpoint

    root = tmp_path_factory.mktemp("ray-model")
    checkpoint = write_checkpoint(tiny_reference("gpt2", n_positions=CONTEXT), root / "ck")
    export_checkpoint(checkpoint, root / "tiny", graph_variant="kv_buffer", validate=False)
    return root / "tiny"


@pytest.fixture(scope="module")
def solo(model_dir):
    from gptedge.runtime import load

    return load(model_dir, device="cpu")


@pytest.fixture(scope="module")
def main_app(cluster, model_dir, url, tmp_path_factory):
    """deploy/ray-serve.yaml with 2 replicas pinned one per node."""
    cfg = config_from_yaml(model_dir, MAIN, int(url.rsplit(":", 1)[1]), PINNED)
    deploy_config(cluster.address, cfg, tmp_path_factory.mktemp("deploy"))
    wait_for(lambda: app_running(MAIN, url, 2), 240, "2 replicas running")
    return url


def want(solo, body):
    sampling = {k: body[k] for k in ("temperature", "top_k", "top_p", "seed", "repetition_penalty") if k in body}
    return solo.generate(body["prompt"], body["max_tokens"], stop=list(body.get("stop") or ()),
                         ignore_eos=body.get("ignore_eos", False), **sampling)


def reason(generation) -> str:
    return "length" if generation.stop in ("max_new_tokens", "context") else "stop"


# Greedy settings of the mixed load. Sampled requests are left out on purpose: on this random tiny model, whose
# logits lie close together, a seeded top-k draw under a batch of 8 can differ from generate alone (reproduced with
# plain `gptedge serve --max-batch 8`, no Ray: fp32 batch variance at the top-k cut), which is the engine's matter.
CASES = [
    dict(temperature=0, logprobs=0),
    dict(temperature=0, stop=[" the", "\n", "e"]),
    dict(temperature=0, logprobs=3, ignore_eos=True),
    dict(temperature=0, repetition_penalty=1.3, logprobs=2),
]
PROMPTS = ["Hello world", "It is a truth universally acknowledged", "The quick brown fox", "A"]


def test_sixteen_concurrent_mixed_requests_equal_generate_on_both_replicas(main_app, cluster, solo):
    bodies = [dict(model=NAME, prompt=PROMPTS[i % 4] * (1 + i % 3), max_tokens=4 + (i * 7) % 30,
                   **CASES[(i // 2) % 4]) for i in range(16)]
    for b in bodies[1::2]:
        b.update(stream=True, stream_options={"include_usage": True})

    async def run():
        async with client(main_app) as http:
            return await asyncio.gather(*(complete(http, b) for b in bodies))

    got = asyncio.run(asyncio.wait_for(run(), 300))
    for body, a in zip(bodies, got, strict=True):
        w = want(solo, body)
        assert a.status == 200 and a.error is None, a
        assert (a.text, a.finish_reason, a.completion_tokens) == (w.text, reason(w), len(w.ids))
        if body.get("logprobs") is not None:  # the greedy ids, one token text each
            assert a.tokens == [solo.tokenizer.decode([t], skip_special_tokens=False) for t in w.ids]
        assert a.done == body.get("stream", False)
    by_replica = {a.replica: cluster.node_names[a.node] for a in got}
    assert len(by_replica) == 2 and sorted(by_replica.values()) == ["head", "node2"], by_replica

    # each replica's own /metrics, reached through the proxy, counts the completions it finished. Asked 8 at a time:
    # one at a time, Ray's router may send every request to the same idle replica (it did, 60 of 60, in one CI run)
    async def scrape() -> list[httpx.Response]:
        async with client(main_app, 30) as http:
            return await asyncio.gather(*(http.get("/metrics") for _ in range(8)))

    finished = {}
    for _ in range(20):
        for r in asyncio.run(scrape()):
            counts = re.findall(r'^gptedge_finished_requests_total\{reason="\w+"\} (\d+)$', r.text, re.M)
            finished[r.headers["x-gptedge-replica"]] = sum(map(int, counts))
        if len(finished) == 2:
            break
    assert set(finished) == set(by_replica) and sum(finished.values()) >= 16 and min(finished.values()) >= 1


def test_errors_models_and_health_are_gptedge_serve_s(main_app, solo):
    """The same requests to gptedge serve's app in-process and through Ray's proxy: same status, JSON, headers."""
    from starlette.testclient import TestClient

    from gptedge.runtime.serving.engine import Engine
    from gptedge.serve.app import Generating, ServeState, create_app

    auth = {"Authorization": f"Bearer {KEY}"}
    body = {"model": NAME, "prompt": "Hello", "max_tokens": 4}
    requests = [
        ("POST", "/v1/completions", body, {}),  # no key: 401
        ("POST", "/v1/completions", body, {"Authorization": "Bearer wrong"}),
        ("POST", "/v1/completions", {**body, "model": "other"}, auth),  # 404
        ("POST", "/v1/completions", {**body, "temperature": -1}, auth),  # 400 naming the parameter
        ("POST", "/v1/completions", {**body, "frobnicate": 1}, auth),
        ("POST", "/v1/completions", {**body, "max_tokens": CONTEXT + 1}, auth),
        ("POST", "/v1/completions", {**body, "prompt": "word " * CONTEXT}, auth),  # context_length_exceeded
        ("POST", "/v1/completions", b"{not json", auth),
        ("GET", "/v1/models", None, {}),
        ("GET", "/v1/models", None, auth),
        ("GET", "/v1/models/tiny", None, auth),
        ("GET", "/v1/models/other", None, auth),
        ("GET", "/health", None, {}),
    ]
    engine = Engine(solo, max_batch=8, max_queue=64).start()
    try:
        direct = TestClient(create_app(ServeState(Generating(engine, solo, CONTEXT), NAME, KEY)))
        for method, path, payload, headers in requests:
            kw = {"content": payload} if isinstance(payload, bytes) else {"json": payload} if payload else {}
            d = direct.request(method, path, headers=headers, **kw)
            r = httpx.request(method, f"{main_app}{path}", headers=headers, timeout=60, **kw)

            def strip(j: dict) -> dict:
                return ({**j, "data": [{**m, "created": 0} for m in j["data"]]} if "data" in j
                        else {**j, "created": 0} if "created" in j else j)
            assert (r.status_code, strip(r.json())) == (d.status_code, strip(d.json())), (method, path)
            assert r.headers.get("www-authenticate") == d.headers.get("www-authenticate")
            assert r.headers.get("x-gptedge-replica")
    finally:
        engine.stop(grace_s=0)


def test_killed_replica_fails_only_its_requests_cleanly_and_is_replaced(main_app, cluster, solo):
    stream = [dict(model=NAME, prompt=PROMPTS[i % 4], max_tokens=CONTEXT - 16, temperature=0, ignore_eos=True,
                   stream=True) for i in range(12)]
    wholes = [dict(s, stream=False) for s in stream[:4]]
    streams = stream[:6]  # the streams sent: 6, and more one at a time until both replicas hold one

    async def run():
        async with client(main_app, deadline_s=120) as http:
            placed: list = []
            started = [asyncio.Event() for _ in streams]
            tasks = [asyncio.ensure_future(complete(http, b, e, placed)) for b, e in zip(streams, started, strict=True)]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 120)  # all under way
            # Serve's router picks by its cached queue lengths, so a burst sent at once can all land on one replica
            # (seen in CI under load), leaving nothing for the survivor to finish: one more stream at a time, each
            # once the last is out, until both hold one (the router then sees the one replica's queue)
            for body in stream[6:]:
                if len({a.node for a in placed if a.node is not None}) == 2:
                    break
                streams.append(body)
                started.append(asyncio.Event())
                tasks.append(asyncio.ensure_future(complete(http, body, started[-1], placed)))
                await asyncio.wait_for(started[-1].wait(), 120)
            tasks += [asyncio.ensure_future(complete(http, b)) for b in wholes]
            await asyncio.sleep(0.3)  # the whole ones reach their replicas
            # the victim: the replica holding most streams (at least 3 of the first 6), whose batch is still
            # decoding at the kill; a lone stream can finish first
            held = Counter(a.node for a in placed if a.node is not None)
            assert len(held) == 2, f"streams were not on both replicas: {held}"
            victim_node = held.most_common(1)[0][0]
            # what the kill is to cut off must still be under way (else the test proves nothing about it)
            assert not any(a.done for a in placed if a.node == victim_node), "the victim's streams ended first"
            pids = cluster.worker_pids(f"ray::ServeReplica:{MAIN}:")[victim_node]
            assert len(pids) == 1, pids
            os.kill(pids[0], signal.SIGKILL)
            return await asyncio.wait_for(asyncio.gather(*tasks), 180), victim_node, pids[0]

    got, victim, killed = asyncio.run(run())
    on_victim = [a for a in got[:len(streams)] if a.node == victim]
    survivors = [a for a in got if a.node is not None and a.node != victim]
    assert on_victim and any(a.node != victim for a in got[:len(streams)]), "streams were not on both replicas"
    for a in on_victim:  # cut off: a last error event in OpenAI's shape, no [DONE]
        assert a.status == 200 and not a.done and a.error["code"] == "replica_lost" and a.error["type"] == \
            "server_error", a
    for a in survivors:  # the other replica's requests finish with generate's text
        assert a.status == 200 and a.error is None, a
    for body, a in zip(streams + wholes, got, strict=True):
        if a in survivors:
            assert a.text == want(solo, body).text
    for a in got[len(streams):]:  # whole completions: finished by the survivor, or a 503 to retry
        assert a in survivors or (a.status == 503 and a.error["code"] == "replica_lost"), a

    def replaced() -> bool:  # a new replica process on the victim's node, and Serve counts 2 running
        after = cluster.worker_pids(f"ray::ServeReplica:{MAIN}:").get(victim, [])
        return len(after) == 1 and after[0] != killed and app_running(MAIN, main_app, 2)

    wait_for(replaced, 180, "Ray replaces the killed replica")

    async def again():
        async with client(main_app) as http:
            return await asyncio.gather(*(complete(http, dict(s, max_tokens=8)) for s in streams))

    # Both replicas serve again. Serve's router picks by its own (cached) queue lengths, so one burst of short
    # requests may all land on one replica: up to 5 bursts, every answer whole, until both nodes have answered.
    answered: set[str] = set()
    for _ in range(5):
        fresh = asyncio.run(asyncio.wait_for(again(), 120))
        assert all(a.status == 200 and a.done and a.error is None for a in fresh)
        answered |= {cluster.node_names[a.node] for a in fresh}
        if answered == {"head", "node2"}:
            break
    assert answered == {"head", "node2"}


def test_serve_run_with_an_import_path_and_args(cluster, model_dir, url, solo, tmp_path):
    delete_app(MAIN)
    serve_run(cluster.address, "gptedge.serve.ray_app:app", f"model={model_dir}", "model_name=by-path",
              "threads=1", "num_replicas=1", f"api_key={KEY}", "max_batch=4", "max_tokens_limit=20",
              "--name", "by-path", log=tmp_path / "serve-run.log")
    try:
        wait_for(lambda: app_running("by-path", url, 1), 240, "the app of `serve run MODULE:app`")
        body = dict(model="by-path", prompt="Hello world", max_tokens=12, temperature=0)
        a = asyncio.run(asyncio.wait_for(_one(url, body), 120))
        assert a.status == 200 and a.text == want(solo, body).text
        auth = {"Authorization": f"Bearer {KEY}"}
        assert httpx.get(f"{url}/v1/models", headers=auth, timeout=60).json()["data"][0]["id"] == "by-path"
        assert httpx.get(f"{url}/v1/models", timeout=60).status_code == 401  # api_key=KEY is required
        too_many = httpx.post(f"{url}/v1/completions", json={**body, "max_tokens": 21}, headers=auth, timeout=60)
        assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "max_tokens"
    finally:
        delete_app("by-path")


async def _one(url, body) -> Answer:
    async with client(url) as http:
        return await complete(http, body)


def test_autoscaling_adds_a_replica_under_load_and_removes_it_when_idle(cluster, model_dir, url, tmp_path):
    delete_app(MAIN)
    autoscaling = {"min_replicas": 1, "initial_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 1,
                   "upscale_delay_s": 1, "downscale_delay_s": 4, "metrics_interval_s": 0.5,
                   "look_back_period_s": 2}
    cfg = config_from_yaml(model_dir, "auto", int(url.rsplit(":", 1)[1]),
                           {"autoscaling_config": autoscaling, "max_replicas_per_node": 1,
                            "ray_actor_options": {"num_cpus": 1, "resources": {SLOT: 1}}})
    deploy_config(cluster.address, cfg, tmp_path)
    try:
        wait_for(lambda: app_running("auto", url, 1), 240, "the autoscaling app with 1 replica")
        body = dict(model=NAME, prompt="Hello", max_tokens=64, temperature=0, ignore_eos=True, stream=True)
        seen: set[str] = set()

        async def load():  # 4 clients, one request after another, until 2 replicas answered (bounded)
            async with client(url) as http:
                async def one_client():
                    deadline = asyncio.get_running_loop().time() + 180
                    while len(seen) < 2 and asyncio.get_running_loop().time() < deadline:
                        a = await complete(http, body)
                        assert a.status == 200 and a.done, a
                        seen.add(a.replica)
                await asyncio.gather(*(one_client() for _ in range(4)))

        asyncio.run(asyncio.wait_for(load(), 240))
        assert len(seen) == 2, f"load never brought up a second replica: {replica_states('auto')}"
        wait_for(lambda: replica_states("auto") == {"RUNNING": 1}, 120, "idle: back to 1 replica")
    finally:
        delete_app("auto")
