"""Helpers of the Ray Serve tests: deploy the shipped YAML (with test overrides) on a LocalCluster through
`serve run`, wait for Serve's state, and send completions through Ray's HTTP proxy, recording which replica
answered. Every wait has a bound; every request a client deadline."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY_YAML = ROOT / "deploy" / "ray-serve.yaml"
SERVE = str(Path(sys.executable).with_name("serve"))
KEY = "ray-test-key"
NAME = "tiny"
SLOT = "gptedge_slot"  # one per node: replicas each take one, so there is one replica per node
CLUSTER_ENV = {
    "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": "gptedge.serve.ray_proxy:proxy_middlewares",
    "RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING": "0",  # one entry point: balance by queue length, not locality
}
# deploy/ray-serve.yaml's deployment made 2 replicas, one per node
PINNED = {"num_replicas": 2, "max_replicas_per_node": 1, "ray_actor_options": {"num_cpus": 1, "resources": {SLOT: 1}}}


def serve_run(address: str, *args: str, log: Path) -> None:
    """`serve run ... --non-blocking`: deploy and return (the application stays on the cluster)."""
    with open(log, "ab") as out:
        run = subprocess.run([SERVE, "run", *args, "--non-blocking", "--address", address], stdout=out,
                             stderr=subprocess.STDOUT, timeout=180)
    assert run.returncode == 0, log.read_text()[-3000:]


def config_from_yaml(model_dir: Path, name: str, port: int, deployment: dict, args: dict | None = None) -> dict:
    """deploy/ray-serve.yaml as shipped, pointed at the test model; one proxy (on the head) on `port`."""
    cfg = yaml.safe_load(DEPLOY_YAML.read_text())
    cfg["proxy_location"], cfg["http_options"] = "HeadOnly", {"host": "127.0.0.1", "port": port}
    app = cfg["applications"][0]
    app["name"] = name
    app["args"].update(model=str(model_dir), model_name=NAME, **(args or {}))
    app["runtime_env"]["env_vars"]["GPTEDGE_API_KEY"] = KEY
    dep = app["deployments"][0]
    if "num_replicas" in deployment:
        dep.pop("autoscaling_config")
    dep.update(deployment)
    return cfg


def deploy_config(address: str, cfg: dict, tmp: Path) -> None:
    path = tmp / f"{cfg['applications'][0]['name']}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    serve_run(address, str(path), log=tmp / "serve-run.log")


def wait_for(predicate, bound_s: float, what: str, pause: float = 0.5):
    deadline = time.monotonic() + bound_s
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(pause)
    raise AssertionError(f"{what}: not within {bound_s:g}s (last: {last!r})")


def disconnect() -> None:
    """Leave the cluster this process joined with ray.init, forgetting Serve's client too: Ray Serve caches its
    controller's handle per process (ray.serve.context), and a later cluster in the same pytest process would
    otherwise be asked through the dead one ("Can't find actor ...")."""
    import ray
    from ray.serve import context

    context._set_global_client(None)
    ray.shutdown()


def replica_states(app: str) -> dict[str, int]:
    from ray import serve

    status = serve.status().applications.get(app)
    if status is None:
        return {}
    return {str(k): v for d in status.deployments.values() for k, v in d.replica_states.items()}


def app_running(app: str, url: str, replicas: int) -> bool:
    from ray import serve

    status = serve.status().applications.get(app)
    if status is None or status.status != "RUNNING" or replica_states(app).get("RUNNING", 0) != replicas:
        return False
    try:
        return httpx.get(f"{url}/health", timeout=10).status_code == 200
    except httpx.TransportError:
        return False


def delete_app(app: str) -> None:
    from ray import serve

    serve.delete(app, _blocking=True)


@dataclass
class Answer:
    status: int
    replica: str | None
    node: str | None
    text: str = ""
    finish_reason: str | None = None
    error: dict | None = None  # the OpenAI error object (a JSON body, or a stream's error event)
    done: bool = False  # a stream's [DONE] arrived
    tokens: list[str] = field(default_factory=list)  # logprobs' token texts, when asked for
    completion_tokens: int | None = None


async def complete(http: httpx.AsyncClient, body: dict, started: asyncio.Event | None = None,
                   placed: list[Answer] | None = None) -> Answer:
    """One completion through the proxy, streamed or not; `started` is set at the first streamed text; a stream's
    Answer is appended to `placed` once its headers say which replica and node took it."""
    headers = {"Authorization": f"Bearer {KEY}"}
    if not body.get("stream"):
        r = await http.post("/v1/completions", json=body, headers=headers)
        a = Answer(r.status_code, r.headers.get("x-gptedge-replica"), r.headers.get("x-gptedge-node"))
        data = r.json()
        if r.status_code != 200:
            a.error = data["error"]
            return a
        c = data["choices"][0]
        a.text, a.finish_reason = c["text"], c["finish_reason"]
        a.tokens = (c["logprobs"] or {}).get("tokens", [])
        a.completion_tokens = data["usage"]["completion_tokens"]
        return a
    async with http.stream("POST", "/v1/completions", json=body, headers=headers) as r:
        a = Answer(r.status_code, r.headers.get("x-gptedge-replica"), r.headers.get("x-gptedge-node"))
        if placed is not None:
            placed.append(a)
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                a.done = True
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                a.error = chunk["error"]
                continue
            if chunk.get("usage"):
                a.completion_tokens = chunk["usage"]["completion_tokens"]
            for c in chunk["choices"]:
                a.text += c["text"]
                a.finish_reason = c["finish_reason"] or a.finish_reason
                a.tokens += (c["logprobs"] or {}).get("tokens", [])
                if started is not None and c["text"]:
                    started.set()
    return a


def client(url: str, deadline_s: float = 120) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, timeout=deadline_s, limits=httpx.Limits(max_connections=64))
