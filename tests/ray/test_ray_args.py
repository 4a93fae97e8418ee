"""The Ray app's arguments (gptedge/serve/ray_app.py parse_args, deployment_options) at each edge: every limit at its
smallest accepted value and one below it, each type's spellings, the exact error lines. No cluster."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("ray.serve", reason="the [ray] extra is not installed")

from gptedge.serve.ray_app import (  # noqa: E402 - after the skip above
    ReplicaConfig,
    ReplicaHeaders,
    app,
    deployment_options,
    parse_args,
)


def test_defaults():
    config, replicas = parse_args({"model": "m"})
    assert config == ReplicaConfig("m") and replicas is None
    assert (config.threads, config.max_batch, config.max_queue, config.max_tokens_limit, config.device,
            config.shutdown_timeout, config.model_name, config.api_key) == (1, 8, 64, None, "cpu", 10.0, None, None)
    assert ReplicaConfig("/a/b/dir").served_name == "dir" and ReplicaConfig("d", model_name="x").served_name == "x"


@pytest.mark.parametrize("key, ok, bad, says", [
    ("threads", 1, 0, "threads must be >= 1"),
    ("max_batch", 1, 0, "max_batch must be >= 1"),
    ("max_queue", 0, -1, "max_queue and shutdown_timeout must be >= 0"),
    ("shutdown_timeout", 0, -0.5, "max_queue and shutdown_timeout must be >= 0"),
    ("max_tokens_limit", 1, 0, "max_tokens_limit must be >= 1"),
    ("num_replicas", 1, 0, r"num_replicas must be >= 1 \(or auto\)"),
])
def test_each_limit_at_its_edge_and_one_past(key, ok, bad, says):
    config, replicas = parse_args({"model": "m", key: str(ok)})
    assert (replicas if key == "num_replicas" else getattr(config, key)) == ok
    with pytest.raises(ValueError, match=f"^{says}$"):
        parse_args({"model": "m", key: bad})


@pytest.mark.parametrize("value, parsed", [("3", 3), (3, 3), ("3.0", 3), (3.0, 3), ("1e1", 10)])
def test_integers_as_serve_run_and_yaml_spell_them(value, parsed):
    config, replicas = parse_args({"model": "m", "max_batch": value, "num_replicas": value})
    assert config.max_batch == parsed and type(config.max_batch) is int and replicas == parsed
    assert type(replicas) is int


@pytest.mark.parametrize("value", ["3.5", 2.5, True, False, "x", "", [1], "inf", "nan"])
def test_what_is_not_an_integer(value):
    with pytest.raises(ValueError, match=rf"^max_batch={re.escape(repr(value))} is not an integer$"):
        parse_args({"model": "m", "max_batch": value})


def test_floats_strings_and_none():
    config, _ = parse_args({"model": "m", "shutdown_timeout": "2.5", "device": "cuda", "model_name": "n",
                            "api_key": None, "max_tokens_limit": None})
    assert (config.shutdown_timeout, config.device, config.model_name, config.api_key, config.max_tokens_limit) == (
        2.5, "cuda", "n", None, None)
    assert type(parse_args({"model": "m", "shutdown_timeout": 3})[0].shutdown_timeout) is float
    with pytest.raises(ValueError, match=r"^shutdown_timeout='soon' is not a number$"):
        parse_args({"model": "m", "shutdown_timeout": "soon"})
    assert parse_args({"model": "m", "num_replicas": "auto"})[1] == "auto"
    with pytest.raises(ValueError, match=r"^num_replicas='many' is not an integer$"):
        parse_args({"model": "m", "num_replicas": "many"})


def test_unknown_and_missing_arguments_are_one_line():
    with pytest.raises(ValueError, match=r"^unknown argument replicas, thread; known: model, model_name, threads, "
                                         r"max_batch, max_queue, max_tokens_limit, api_key, device, shutdown_timeout, "
                                         r"num_replicas$"):
        parse_args({"model": "m", "thread": 1, "replicas": 2})
    for args in ({}, {"model": ""}, {"model": None}, {"threads": 1}):
        with pytest.raises(ValueError, match=r"^model=DIR is required: a gptedge model dir at a path every Ray node "
                                             r"sees$"):
            parse_args(args)


def test_ray_options_follow_the_config():
    config = ReplicaConfig("m", threads=3, max_batch=5, shutdown_timeout=1.5)
    assert deployment_options(config, None) == {"ray_actor_options": {"num_cpus": 3}, "max_ongoing_requests": 5,
                                                 "graceful_shutdown_timeout_s": 1.5}
    assert deployment_options(config, "auto")["num_replicas"] == "auto"
    assert deployment_options(config, 2)["num_replicas"] == 2


def test_app_refuses_a_dir_without_a_manifest(tmp_path):
    with pytest.raises(ValueError, match=rf"^{re.escape(str(tmp_path))} is not a gptedge model dir \(no gptedge.json\) "
                                         r"here; every Ray node must see the model dir at this path$"):
        app({"model": str(tmp_path)})
    with pytest.raises(ValueError, match="^unknown argument x;"):  # the args are checked first
        app({"model": str(tmp_path), "x": 1})


def test_app_takes_a_model_dir_every_node_sees(gpt2_model_dir):
    assert app({"model": str(gpt2_model_dir), "num_replicas": "2"}) is not None


def test_every_http_response_names_its_replica_and_node():
    import asyncio

    async def inner(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"a", b"1")]})
        await send({"type": "http.response.body", "body": b"x"})

    async def run(scope_type):
        sent = []

        async def send(message):
            sent.append(message)

        await ReplicaHeaders(inner, "r1", "n\u00e9")({"type": scope_type}, None, send)
        return sent

    start, body = asyncio.run(run("http"))
    assert start["headers"] == [(b"a", b"1"), (b"x-gptedge-replica", b"r1"), (b"x-gptedge-node", "n\u00e9".encode())]
    assert body == {"type": "http.response.body", "body": b"x"}
    start, _ = asyncio.run(run("lifespan"))  # not HTTP: passed through untouched
    assert start["headers"] == [(b"a", b"1")]

    async def bare(scope, receive, send):
        await send({"type": "http.response.start", "status": 204})

    async def run_bare():
        sent = []

        async def send(message):
            sent.append(message)

        await ReplicaHeaders(bare, "r", "n")({"type": "http"}, None, send)
        return sent

    assert asyncio.run(run_bare())[0]["headers"] == [(b"x-gptedge-replica", b"r"), (b"x-gptedge-node", b"n")]


def test_a_replica_config_is_immutable():
    """A config is a value (app() makes the resolved one with dataclasses.replace), never edited in place."""
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        ReplicaConfig("m").threads = 4  # type: ignore[misc]


def test_a_replica_serves_its_config(gpt2_model_dir, monkeypatch):
    """The replica class itself (what Ray instantiates), outside a cluster: Ray's context replaced by fakes."""
    from types import SimpleNamespace

    from gptedge.serve import ray_app

    monkeypatch.setattr(ray_app.serve, "get_replica_context",
                        lambda: SimpleNamespace(replica_id=SimpleNamespace(unique_id="rep-7")))
    monkeypatch.setattr(ray_app.ray, "get_runtime_context", lambda: SimpleNamespace(get_node_id=lambda: "node" * 8))
    monkeypatch.setenv("GPTEDGE_API_KEY", "from-env")
    wrapped = ray_app.GptEdgeReplica.func_or_class  # serve.ingress' subclass; ours is the one defining the app
    cls = next(c for c in wrapped.__mro__ if "__serve_build_asgi_app__" in c.__dict__)
    replica = cls(ReplicaConfig(str(gpt2_model_dir), max_batch=3, max_queue=5, max_tokens_limit=7))
    try:
        state = replica.state
        assert (replica.engine.max_batch, replica.engine.max_queue) == (3, 5)
        assert (state.name, state.api_key, state.served.max_tokens_limit) == (gpt2_model_dir.name, "from-env", 7)
        assert state.served.engine is replica.engine and (replica.replica_id, replica.node_id) == ("rep-7", "node" * 8)
        asgi = replica.__serve_build_asgi_app__()
        assert isinstance(asgi, ReplicaHeaders)
        assert asgi.headers == [(b"x-gptedge-replica", b"rep-7"), (b"x-gptedge-node", b"node" * 8)]
    finally:
        replica.__del__()
    assert state.stopping is True and not replica.engine._thread.is_alive()
    monkeypatch.delenv("GPTEDGE_API_KEY")
    other = cls(ReplicaConfig(str(gpt2_model_dir), model_name="served", api_key="k"))
    try:
        context = other.engine.model.manifest.shape.context_length
        assert (other.state.name, other.state.api_key, other.state.served.max_tokens_limit) == ("served", "k", context)
    finally:
        other.__del__()
    keyless = cls(ReplicaConfig(str(gpt2_model_dir), api_key=""))
    try:
        assert keyless.state.api_key is None  # an empty key is no key, not a key every client must send empty
    finally:
        keyless.__del__()
