"""gptedge on Ray Serve: each replica loads one model dir and runs `gptedge serve`'s own app and engine (docs/ray.md).

    serve run gptedge.serve.ray_app:app model=/shared/models/int8 threads=1 num_replicas=2
    serve run deploy/ray-serve.yaml            # or `serve deploy` the same YAML to a running cluster

A replica is `gptedge serve` minus uvicorn: it loads the model with `threads` ONNX Runtime threads (and reserves
as many CPUs from Ray), starts the continuous-batching engine, and hands Ray the Starlette app of
gptedge/serve/app.py, so routes, parameters, error JSON, status codes, the API-key check and the per-replica
/metrics are those of `gptedge serve` (and whatever hardening app.py gains). Ray's HTTP proxy forwards each
request's ASGI messages to one replica and streams the answer back; every response names the replica and the
Ray node that produced it in `x-gptedge-replica` / `x-gptedge-node` headers.

The model dir is a path every node sees (a shared filesystem, or the same files placed at the same path on
each node); each replica checks the manifest against the files at load like any `load()` (sizes, contract),
and a replica that cannot load fails its start, which Ray reports and retries. No URI fetching.

Arguments (`serve run ... key=value`, or `args:` in the YAML), each a field of ReplicaConfig, plus
`num_replicas`: an integer, or `auto` for Ray's default autoscaling (the YAML's `autoscaling_config` says more).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass, fields
from pathlib import Path

import ray
from ray import serve

from gptedge.runtime import SessionConfig, load
from gptedge.runtime.serving.engine import Engine

from .app import Generating, ServeState, create_app

log = logging.getLogger(__name__)

DEPLOYMENT = "GptEdge"  # the deployment's name: the YAML's `deployments: - name:` refers to it
REPLICA_HEADER, NODE_HEADER = b"x-gptedge-replica", b"x-gptedge-node"


@dataclass(frozen=True)
class ReplicaConfig:
    """What one replica serves and how; the same knobs as `gptedge serve`'s options of the same names."""

    model: str  # the model dir: a path every node sees
    model_name: str | None = None  # the id clients send (default: the dir's name)
    threads: int = 1  # ONNX Runtime intra-op threads; the replica reserves as many CPUs (num_cpus)
    max_batch: int = 8
    max_queue: int = 64
    max_tokens_limit: int | None = None  # default: the model's context
    api_key: str | None = None  # default: $GPTEDGE_API_KEY in the replica's environment (runtime_env env_vars)
    device: str = "cpu"
    shutdown_timeout: float = 10.0  # seconds in-flight requests may finish when a replica is stopped

    @property
    def served_name(self) -> str:
        return self.model_name or Path(self.model).resolve().name


def _coerce(value, kind, key: str):
    """A `serve run key=value` string (or a YAML scalar) -> the field's type; ValueError naming the key."""
    if value is None or kind is str:
        return value
    try:
        if kind is float:
            return float(value)
        if isinstance(value, bool) or float(value) != int(float(value)):
            raise ValueError
        return int(float(value))
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{key}={value!r} is not {'a number' if kind is float else 'an integer'}") from None


def parse_args(args: dict) -> tuple[ReplicaConfig, int | str | None]:
    """Application args -> (ReplicaConfig, num_replicas). Unknown keys and bad values raise ValueError."""
    types = {f.name: f.type for f in fields(ReplicaConfig)}
    kinds = {k: int if "int" in t else float if "float" in t else str for k, t in types.items()}
    unknown = sorted(set(args) - set(kinds) - {"num_replicas"})
    if unknown:
        raise ValueError(f"unknown argument {', '.join(unknown)}; known: {', '.join([*kinds, 'num_replicas'])}")
    if not args.get("model"):
        raise ValueError("model=DIR is required: a gptedge model dir at a path every Ray node sees")
    values = {k: _coerce(v, kinds[k], k) for k, v in args.items() if k != "num_replicas"}
    config = ReplicaConfig(**values)
    for key in ("threads", "max_batch"):
        if getattr(config, key) < 1:
            raise ValueError(f"{key} must be >= 1")
    if config.max_queue < 0 or config.shutdown_timeout < 0:
        raise ValueError("max_queue and shutdown_timeout must be >= 0")
    if config.max_tokens_limit is not None and config.max_tokens_limit < 1:
        raise ValueError("max_tokens_limit must be >= 1")
    replicas = args.get("num_replicas")
    if replicas is not None and replicas != "auto":
        replicas = _coerce(replicas, int, "num_replicas")
        if replicas < 1:
            raise ValueError("num_replicas must be >= 1 (or auto)")
    return config, replicas


class ReplicaHeaders:
    """ASGI middleware naming the replica and node on every response: which replica served whom is visible."""

    def __init__(self, app, replica: str, node: str):
        self.app, self.headers = app, [(REPLICA_HEADER, replica.encode()), (NODE_HEADER, node.encode())]

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_named(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self.headers]}
            await send(message)

        await self.app(scope, receive, send_named)


@serve.deployment(name=DEPLOYMENT)
@serve.ingress()
class GptEdgeReplica:
    """One replica: the model, its engine thread, and `gptedge serve`'s app over them."""

    def __init__(self, config: ReplicaConfig):
        started = time.perf_counter()
        self.config = config
        model = load(config.model, device=config.device, session=SessionConfig(threads=config.threads))
        _ = model.tokenizer  # fail the replica's start on a missing tokenizer, not its first request
        self.engine = Engine(model, max_batch=config.max_batch, max_queue=config.max_queue).start()
        api_key = config.api_key or os.environ.get("GPTEDGE_API_KEY") or None
        self.state = ServeState(Generating(self.engine, model,
                                           config.max_tokens_limit or model.manifest.shape.context_length),
                                config.served_name, api_key)
        context = serve.get_replica_context()
        self.replica_id = context.replica_id.unique_id
        self.node_id = ray.get_runtime_context().get_node_id()
        log.info("replica %s on node %s: loaded %s (%s) in %.2fs, pid %d", self.replica_id, self.node_id[:12],
                 config.model, model.manifest.precision, time.perf_counter() - started, os.getpid())

    def __serve_build_asgi_app__(self):
        return ReplicaHeaders(create_app(self.state), self.replica_id, self.node_id)

    def __del__(self):
        # Ray has already let in-flight requests run for graceful_shutdown_timeout_s; cancel what is left.
        # (A replica whose __init__ failed has no engine to stop.)
        if hasattr(self, "state"):
            self.state.stopping = True
        if hasattr(self, "engine"):
            self.engine.stop(grace_s=0)


def deployment_options(config: ReplicaConfig, num_replicas: int | str | None) -> dict:
    """Ray options following from the config. CPUs = threads. A replica takes at most a full batch
    (max_ongoing_requests = max_batch): Ray's router holds the rest and gives each to the first replica with a
    free row, rather than letting it wait in one replica's queue while another has room."""
    options = {"ray_actor_options": {"num_cpus": config.threads}, "max_ongoing_requests": config.max_batch,
               "graceful_shutdown_timeout_s": config.shutdown_timeout}
    if num_replicas is not None:
        options["num_replicas"] = num_replicas
    return options


def app(args: dict) -> serve.Application:
    """The application builder `serve run` / `serve deploy` call with the args (see the module docstring)."""
    config, replicas = parse_args(dict(args))
    if not (Path(config.model) / "gptedge.json").is_file():
        raise ValueError(f"{config.model} is not a gptedge model dir (no gptedge.json) here; every Ray node must "
                         f"see the model dir at this path")
    config = dataclasses.replace(config, model=str(Path(config.model).resolve()))
    return GptEdgeReplica.options(**deployment_options(config, replicas)).bind(config)
