"""The HTTP routes: parse, validate, submit to the engine, and send its events back (JSON or Server-Sent Events).

The engine thread owns the session; this module never runs the model. Engine events arrive on the engine
thread and are handed to the event loop with `call_soon_threadsafe`. Each route watches its client: one
that goes away (mid-body, mid-stream, or while waiting for a whole completion) has its engine requests
cancelled, which frees their batch rows at the engine's next step, and is counted as a 499, never a 500.

What one request may cost is bounded before the work (limits.py): the body's size and arrival time, its
JSON's depth and text, the prompt's bytes before tokenization; tokenization runs in a worker thread, so
the event loop keeps answering (/health, 401s) while it does.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gptedge.runtime.engine import (CompletionRequest, Engine, EngineStoppedError, FinishReason, QueueFullError,
                                    TokenEvent)
from gptedge.runtime.errors import InvalidArgumentError, PromptTooLongError
from gptedge.runtime.generation import check_prompts

from .classify_app import ClassifyApi
from .classify_schema import generation_card
from .limits import ClientGone, check_prompt_bytes, longest_token_bytes, parse_json, read_body
from .openai_schema import (ApiError, Completion, CompletionParams, Logprobs, choice, error_body, model_card,
                            parse_completion_request)
from .routes import RETRY_AFTER_S, Routes, ServeState, _wait_disconnect

__all__ = ["RETRY_AFTER_S", "ServeState", "create_app"]  # the first two live in routes.py; callers import them here

log = logging.getLogger(__name__)


def _dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


class Job:
    """One completion's engine requests (one per prompt), and their events as (index, TokenEvent) on the loop."""

    def __init__(self, engine: Engine):
        self.engine, self.loop = engine, asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[int, TokenEvent]] = asyncio.Queue()
        self.handles = []

    def submit(self, requests: list[CompletionRequest]) -> None:
        """All or nothing: when one is refused (queue full, shutting down) those already queued are cancelled."""
        try:
            for i, r in enumerate(requests):
                self.handles.append(self.engine.submit(r, functools.partial(self._on_event, i)))
        except BaseException:
            self.cancel()
            raise

    def _on_event(self, index: int, event: TokenEvent) -> None:  # on the engine thread
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (index, event))
        except RuntimeError:  # the loop is closed: nobody listens any more
            pass

    def cancel(self) -> None:
        for h in self.handles:
            h.cancel()

    async def events(self, gone: asyncio.Future) -> AsyncIterator[tuple[int, TokenEvent]]:
        """Every event until each request has finished; ClientGone as soon as `gone` completes."""
        remaining = len(self.handles)
        while remaining:
            if self.queue.empty():
                get = asyncio.ensure_future(self.queue.get())
                await asyncio.wait((get, gone), return_when=asyncio.FIRST_COMPLETED)
                if not get.done():
                    get.cancel()
                    raise ClientGone()
                item = get.result()
            else:
                item = self.queue.get_nowait()
            remaining -= item[1].finish_reason is not None
            yield item


@dataclass
class ChoiceState:
    """What one choice has gathered so far."""

    echo: str  # the prompt's text when echo is on, else ""
    logprobs: Logprobs | None
    text: str = ""
    finish_reason: FinishReason | None = None
    completion_tokens: int = 0

    def take(self, event: TokenEvent, token_text, top_n: int | None) -> Logprobs | None:
        """Add one event -> the logprobs entry it adds (None when logprobs are off or it has no token)."""
        entry = None
        if self.logprobs is not None and event.token_id is not None:
            entry = Logprobs()
            top = {token_text(t): lp for t, lp in list((event.top_logprobs or {}).items())[:top_n]}
            entry.add(token_text(event.token_id), event.logprob, top, len(self.echo) + len(self.text))
            for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                getattr(self.logprobs, name).extend(getattr(entry, name))
        self.text += event.text
        if event.finish_reason is not None:
            self.finish_reason = event.finish_reason
            self.completion_tokens = len(event.generation.ids) if event.generation is not None else 0
        return entry


def _failure(event: TokenEvent) -> ApiError | None:
    if event.finish_reason == FinishReason.CANCELLED:
        return ApiError(503, "the server shut down before this completion finished", "server_error",
                        code="shutting_down")
    if event.finish_reason == FinishReason.ERROR:
        return ApiError(500, f"generation failed: {event.error}", "server_error")
    return None


class EventStream:
    """A raw ASGI response sending Server-Sent Events; it owns the job and cancels it however it ends."""

    def __init__(self, job: Job, chunks):
        self.job, self.chunks = job, chunks  # chunks(gone) -> async iterator of data strings

    async def __call__(self, scope, receive, send) -> None:
        gone = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream; charset=utf-8"),
                                    (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]})
            async for data in self.chunks(gone):
                await send({"type": "http.response.body", "body": f"data: {data}\n\n".encode(), "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except (ClientGone, OSError):
            log.info("client went away mid-stream; its requests are cancelled")
        finally:
            gone.cancel()
            self.job.cancel()


class Api(Routes):
    """A language model's routes: parse and check a request, hand it to the engine, shape the answer (never the
    session)."""

    def __init__(self, state: ServeState):
        super().__init__(state)
        self.model, self.engine = state.model, state.engine
        self.context = state.model.manifest.shape.context_length
        tokenizer = state.model.tokenizer
        # no text longer than this fits the context: each token covers at most the longest token's bytes
        self.max_prompt_bytes = self.context * longest_token_bytes(tokenizer, state.model.manifest.shape.vocab_size)
        # a token's own text, for logprobs: cached, the same ids recur
        self.token_text = functools.lru_cache(maxsize=65536)(
            lambda token_id: tokenizer.decode([token_id], skip_special_tokens=False))

    def prompt_ids(self, params: CompletionParams) -> list[list[int]]:
        ids = [self.model.encode_prompt(p) if isinstance(p, str) else list(p) for p in params.prompts]
        try:
            check_prompts(ids, params.max_tokens, self.context, self.model.manifest.shape.vocab_size)
        except PromptTooLongError as e:
            raise ApiError(400, f"{e}; shorten the prompt", param="prompt", code="context_length_exceeded") from None
        except InvalidArgumentError as e:
            raise ApiError(400, str(e), param="prompt") from None
        return ids

    def submit(self, params: CompletionParams, ids: list[list[int]]) -> Job:
        if self.state.stopping:
            raise ApiError(503, "the server is shutting down", "server_error", code="shutting_down")
        top = None if params.logprobs is None else max(params.logprobs, 1)  # the engine reports logprobs with N >= 1
        job = Job(self.engine)
        try:
            job.submit([CompletionRequest(tuple(p), params.max_tokens, params.sampling, params.stop, top or 0,
                                          params.ignore_eos) for p in ids])
        except QueueFullError as e:
            raise ApiError(429, f"the server is busy ({e}); retry shortly", "rate_limit_error", code="queue_full",
                           headers={"Retry-After": str(RETRY_AFTER_S)}) from None
        except EngineStoppedError:
            raise ApiError(503, "the server is shutting down", "server_error", code="shutting_down") from None
        return job

    async def completions(self, request: Request) -> Response:
        self.authorize(request)  # before a byte of the body is read
        if self.state.stopping:
            raise ApiError(503, "the server is shutting down", "server_error", code="shutting_down")
        limits = self.state.limits
        body = await read_body(request.receive, request.headers, limits, lambda: self.state.stopping,
                               self.state.dropped)
        params = parse_completion_request(parse_json(body, limits), self.state.max_tokens_limit)
        del body
        self.check_model(params.model)
        check_prompt_bytes(params.prompts, self.max_prompt_bytes)
        ids = await run_in_threadpool(self.prompt_ids, params)  # tokenizing: off the event loop
        choices = [ChoiceState(self.model.decode(p) if params.echo else "",
                               Logprobs() if params.logprobs is not None else None) for p in ids]
        job = self.submit(params, ids)
        out = Completion(self.state.name)
        if params.stream:
            return EventStream(job, functools.partial(self.stream_chunks, job, params, choices, out, ids))
        gone = asyncio.ensure_future(_wait_disconnect(request.receive))
        try:
            async for i, event in job.events(gone):
                if (failure := _failure(event)) is not None:
                    raise failure
                choices[i].take(event, self.token_text, params.logprobs)
        except ClientGone:
            return Response(status_code=499)  # nobody reads it; the access log shows the client left
        finally:
            gone.cancel()
            job.cancel()
        return JSONResponse(out.response(
            [choice(i, c.echo + c.text, c.finish_reason, c.logprobs) for i, c in enumerate(choices)],
            sum(map(len, ids)), sum(c.completion_tokens for c in choices)))

    async def stream_chunks(self, job: Job, params: CompletionParams, choices: list[ChoiceState], out: Completion,
                            ids: list[list[int]], gone) -> AsyncIterator[str]:
        for i, c in enumerate(choices):
            if c.echo:
                yield _dumps(out.chunk(i, c.echo))
        async for i, event in job.events(gone):
            if (failure := _failure(event)) is not None:
                yield _dumps(failure.body())  # the openai client raises APIError on it
                return
            entry = choices[i].take(event, self.token_text, params.logprobs)
            if event.text or entry is not None or event.finish_reason is not None:
                yield _dumps(out.chunk(i, event.text, event.finish_reason, entry))
        if params.include_usage:
            yield _dumps(out.usage_chunk(sum(map(len, ids)), sum(c.completion_tokens for c in choices)))
        yield "[DONE]"

    def card(self) -> dict:
        return {**model_card(self.state.name, self.state.created), **generation_card(self.context)}

    def metric_lines(self) -> list[str]:
        return self.engine.metrics.render()


async def api_error(request: Request, exc: ApiError) -> Response:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

async def http_error(request: Request, exc: HTTPException) -> Response:
    return JSONResponse(error_body(str(exc.detail)), status_code=exc.status_code, headers=exc.headers)

async def client_gone(request: Request, exc: Exception) -> Response:
    """The client left before its answer: nobody reads this one; /metrics counts it as a 499, the log says
    nothing (a disconnect is the client's choice, not a server fault)."""
    return Response(status_code=499)

async def server_error(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s", request.url.path)
    return JSONResponse(error_body(f"internal error: {type(exc).__name__}", "server_error"), status_code=500)


def create_app(state: ServeState, extra_routes: tuple[Route, ...] = ()) -> Starlette:
    """The API's routes, then `extra_routes` (the playground page: serve/playground.py)."""
    if state.classifier is not None:
        api = ClassifyApi(state)  # a classifier dir: /v1/classify, and /v1/completions refused
        posts = [Route("/v1/completions", api.refuse, methods=["POST"]),
                 Route("/v1/classify", api.classify, methods=["POST"])]
    else:
        api = Api(state)
        posts = [Route("/v1/completions", api.completions, methods=["POST"]),
                 Route("/v1/classify", api.refuse, methods=["POST"])]
    app = Starlette(
        routes=[*posts, Route("/v1/models", api.models),
                Route("/v1/models/{model:path}", api.one_model), Route("/health", api.health),
                Route("/metrics", api.metrics), *extra_routes],
        exception_handlers={ApiError: api_error, HTTPException: http_error, ClientGone: client_gone,
                            ClientDisconnect: client_gone, Exception: server_error},
    )
    return CountRequests(app, state.http_counts)


class CountRequests:
    """ASGI middleware counting answered requests by (path, status) for /metrics."""

    PATHS = ("/v1/completions", "/v1/classify", "/v1/models", "/health", "/metrics")

    def __init__(self, app, counts: Counter):
        self.app, self.counts = app, counts

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        label = path if path in self.PATHS else "/v1/models/{model}" if path.startswith("/v1/models/") else "other"
        status = 500

        async def send_counting(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_counting)
        finally:
            self.counts[(label, status)] += 1
