"""What every served model's routes share: the server's state, the API key and model-name checks, /v1/models,
/health and /metrics (`Routes`). app.py's `Api` (a language model: /v1/completions) and classify_app.py's
`ClassifyApi` (a classifier dir: /v1/classify) extend it; each refuses the other's endpoint in one line.
"""

from __future__ import annotations

import hmac
import time
from collections import Counter
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from gptedge.runtime.classify import Classifier
from gptedge.runtime.model import LoadedModel
from gptedge.runtime.modeldir.tasks import article
from gptedge.runtime.serving.classify_batcher import ClassifyBatcher
from gptedge.runtime.serving.engine import Engine

from .classify_schema import CLASSIFICATION
from .limits import CLOSE, DROP_REASONS, Limits
from .openai_schema import ApiError

RETRY_AFTER_S = 1  # what a 429 asks a client to wait: about the time a batch row takes to come free


@dataclass
class Generating:
    """What a language model's server serves: its engine runs the model; the HTTP side reads only the model's
    tokenizer and manifest."""

    engine: Engine
    model: LoadedModel
    max_tokens_limit: int  # the most max_tokens one completion may ask for
    chat_template: str | None = None  # `serve --chat-template FILE`: in place of the model dir's own

    def stop(self, grace_s: float) -> None:
        self.engine.stop(grace_s)


@dataclass
class Classifying:
    """What a classifier dir's server serves: its batcher runs the classifier's sessions."""

    classifier: Classifier
    batcher: ClassifyBatcher
    max_examples: int = 256  # examples one /v1/classify request may hold (413 beyond)

    def stop(self, grace_s: float) -> None:
        self.batcher.stop(grace_s)


@dataclass
class ServeState:
    served: Generating | Classifying  # the one kind of model this server serves
    name: str  # the model id clients send and /v1/models lists
    api_key: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    stopping: bool = False  # set on SIGTERM: /health turns 503 and new completions are refused
    http_counts: Counter = field(default_factory=Counter)  # (path, status) -> requests answered
    limits: Limits = Limits()
    dropped: Counter = field(default_factory=Counter)  # reason (limits.DROP_REASONS) -> requests not read to the end

    def stop(self, grace_s: float) -> None:
        """What SIGTERM starts: in-flight work gets grace_s to finish, then is cancelled."""
        self.served.stop(grace_s)


async def _wait_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class Routes:
    """What every served model answers: the API key, the model name, /v1/models, /health, /metrics."""

    def __init__(self, state: ServeState):
        self.state = state

    def card(self) -> dict:
        """/v1/models' entry: OpenAI's fields and what the model does (classify_schema: task, endpoint, ...)."""
        raise NotImplementedError

    def metric_lines(self) -> list[str]:
        """The model's own counters for /metrics (the engine's, or the classify batcher's)."""
        raise NotImplementedError

    def wrong_task(self, request: Request) -> ApiError:
        """The 400 of the other kind's endpoint: it names this model's task and the endpoint to use."""
        card = self.card()
        name = card.get("task_name", "")
        what = (f"{article(name)} {name} classifier" if card["task"] == CLASSIFICATION
                else "a language model (text-generation)")
        return ApiError(400, f"{request.url.path} does not serve this model: '{self.state.name}' is {what}; "
                             f"send its requests to POST {card['endpoint']} (see GET /v1/models)",
                        param="model", code="unsupported_task", headers=CLOSE)

    def authorize(self, request: Request) -> None:
        if self.state.api_key is None:
            return
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), self.state.api_key.encode()):
            raise ApiError(401, "missing or incorrect API key: send 'Authorization: Bearer KEY'",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    def check_model(self, name: str) -> None:
        if name != self.state.name:
            raise ApiError(404, f"the model '{name}' does not exist; this server serves '{self.state.name}'",
                           param="model", code="model_not_found")

    async def models(self, request: Request) -> Response:
        self.authorize(request)
        return JSONResponse({"object": "list", "data": [self.card()]})

    async def one_model(self, request: Request) -> Response:
        self.authorize(request)
        self.check_model(request.path_params["model"])
        return JSONResponse(self.card())

    async def health(self, request: Request) -> Response:
        if self.state.stopping:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        return JSONResponse({"status": "ok", "model": self.state.name})

    async def metrics(self, request: Request) -> Response:
        lines = ["# HELP gptedge_http_requests_total HTTP requests answered, by path and status.",
                 "# TYPE gptedge_http_requests_total counter"]
        lines += [f'gptedge_http_requests_total{{path="{p}",status="{s}"}} {n}'
                  for (p, s), n in sorted(self.state.http_counts.items())]
        lines += ["# HELP gptedge_http_dropped_total Requests not read to their end: the client left, was too slow, "
                  "sent too much, or the server was stopping.", "# TYPE gptedge_http_dropped_total counter"]
        lines += [f'gptedge_http_dropped_total{{reason="{r}"}} {self.state.dropped[r]}' for r in DROP_REASONS]
        return PlainTextResponse("\n".join(lines + self.metric_lines()) + "\n",
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    async def refuse(self, request: Request) -> Response:
        """The other kind's endpoint (/v1/classify on a language model, /v1/completions on a classifier)."""
        self.authorize(request)
        raise self.wrong_task(request)
