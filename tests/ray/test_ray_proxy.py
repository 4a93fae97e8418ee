"""The Ray pieces that need no cluster: the proxy middleware that finishes a dead replica's responses, the replica's
header middleware, and the application args (parsing, checks, Ray options). test_ray_serve runs them for real."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("starlette")

from gptedge.serve.ray_proxy import ReplicaLossAnswers, proxy_middlewares  # noqa: E402 - after the optional-dependency skips above


def run_asgi(app, path: str = "/v1/completions") -> list[dict]:
    """Call an ASGI app once -> the messages it sent."""
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(app({"type": "http", "path": path, "method": "POST", "headers": []}, receive, send))
    return sent


def replica(*messages):
    """A stand-in for what Ray's proxy relays from a replica: these messages, then nothing (it died)."""
    async def app(scope, receive, send):
        for m in messages:
            await send(m)
    return app


START_SSE = {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
START_JSON = {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}


def test_a_replica_gone_before_answering_gives_a_503_in_openai_shape():
    sent = run_asgi(ReplicaLossAnswers(replica()))
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 503 and dict(sent[0]["headers"])[b"retry-after"] == b"1"
    body = json.loads(sent[1]["body"])
    assert body == {"error": {"message": body["error"]["message"], "type": "server_error", "param": None,
                              "code": "replica_lost"}}
    assert int(dict(sent[0]["headers"])[b"content-length"]) == len(sent[1]["body"])


def test_a_stream_cut_short_ends_with_an_error_event_and_a_closed_body():
    chunk = {"type": "http.response.body", "body": b'data: {"choices": []}\n\n', "more_body": True}
    sent = run_asgi(ReplicaLossAnswers(replica(START_SSE, chunk)))
    assert sent[:2] == [START_SSE, chunk]
    last = sent[2]
    assert last["more_body"] is False and last["body"].startswith(b"data: ") and last["body"].endswith(b"\n\n")
    assert json.loads(last["body"][6:])["error"]["code"] == "replica_lost"
    assert len(sent) == 3


def test_a_json_body_cut_short_is_closed_without_text_added():
    part = {"type": "http.response.body", "body": b'{"id": ', "more_body": True}
    sent = run_asgi(ReplicaLossAnswers(replica(START_JSON, part)))
    assert sent[2] == {"type": "http.response.body", "body": b"", "more_body": False}


@pytest.mark.parametrize("path", ["/v1/completions", "/health"])
def test_complete_responses_and_other_paths_pass_through(path):
    whole = [START_SSE, {"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False}]
    assert run_asgi(ReplicaLossAnswers(replica(*whole)), path) == whole
    assert run_asgi(ReplicaLossAnswers(replica()), "/health") == []  # not ours: Ray answers it as it does


def test_the_proxy_callback_returns_the_middleware():
    (m,) = proxy_middlewares()
    assert m.cls is ReplicaLossAnswers


# -- the replica side: needs ray ------------------------------------------------------------------------------
def test_replica_headers_name_the_replica_and_node():
    pytest.importorskip("ray.serve", reason="the [ray] extra is not installed")
    from gptedge.serve.ray_app import ReplicaHeaders

    sent = run_asgi(ReplicaHeaders(replica(START_JSON, {"type": "http.response.body", "body": b"{}"}), "r1", "n1"))
    headers = dict(sent[0]["headers"])
    assert headers[b"x-gptedge-replica"] == b"r1" and headers[b"x-gptedge-node"] == b"n1"
    assert headers[b"content-type"] == b"application/json" and sent[1]["body"] == b"{}"


def test_args_are_parsed_checked_and_become_ray_options(gpt2_model_dir):
    pytest.importorskip("ray.serve", reason="the [ray] extra is not installed")
    from gptedge.serve.ray_app import ReplicaConfig, app, deployment_options, parse_args

    config, replicas = parse_args({"model": "m", "threads": "2", "max_batch": "4", "shutdown_timeout": "2.5",
                                   "num_replicas": "3", "api_key": "k"})  # `serve run` passes strings
    assert config == ReplicaConfig("m", threads=2, max_batch=4, shutdown_timeout=2.5, api_key="k") and replicas == 3
    assert parse_args({"model": "m", "num_replicas": "auto"})[1] == "auto"
    options = deployment_options(config, replicas)
    assert options["ray_actor_options"] == {"num_cpus": 2} and options["max_ongoing_requests"] == 4
    assert options["num_replicas"] == 3 and options["graceful_shutdown_timeout_s"] == 2.5
    assert "num_replicas" not in deployment_options(config, None)  # left to the YAML (or autoscaling)
    for bad, needle in [({"model": "m", "thread": 1}, "unknown argument thread"), ({}, "model=DIR is required"),
                        ({"model": "m", "threads": "two"}, "threads='two' is not an integer"),
                        ({"model": "m", "threads": 0}, "threads must be >= 1"),
                        ({"model": "m", "max_batch": 1.5}, "is not an integer"),
                        ({"model": "m", "num_replicas": 0}, "num_replicas must be >= 1"),
                        ({"model": "m", "max_tokens_limit": 0}, "max_tokens_limit must be >= 1")]:
        with pytest.raises(ValueError, match=needle):
            parse_args(bad)
    with pytest.raises(ValueError, match="not a gptedge model dir"):
        app({"model": str(gpt2_model_dir.parent)})
    assert app({"model": str(gpt2_model_dir), "threads": 1}) is not None


def test_docs_rayservice_manifest_parses_and_its_serve_config_is_valid():
    """The KubeRay manifest is untested on Kubernetes; at least it is YAML and Ray accepts its Serve config."""
    pytest.importorskip("ray.serve", reason="the [ray] extra is not installed")
    import re
    from pathlib import Path

    import yaml
    from ray.serve.schema import ServeDeploySchema

    page = (Path(__file__).resolve().parents[2] / "docs" / "ray.md").read_text()
    (manifest,) = [m for m in re.findall(r"```yaml\n(.*?)```", page, re.S) if "kind: RayService" in m]
    service = yaml.safe_load(manifest)
    assert service["kind"] == "RayService" and service["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    config = ServeDeploySchema.model_validate(yaml.safe_load(service["spec"]["serveConfigV2"]))
    assert config.applications[0].import_path == "gptedge.serve.ray_app:app"
    env = service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH",
            "value": "gptedge.serve.ray_proxy:proxy_middlewares"} in env
