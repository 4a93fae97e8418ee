"""The HTTP routes: parse, validate, submit to the engine, and send its events back (JSON or Server-Sent Events).

The engine thread owns the session; this module never runs the model. Engine events arrive on the engine
thread and are handed to the event loop, and streamed, by event_stream.py (Job, EventStream). Each route watches
its client: one
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

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gptedge.runtime.errors import InvalidArgumentError, PromptTooLongError
from gptedge.runtime.generation.text_stream import token_offsets
from gptedge.runtime.modeldir.chat_template import find_chat_template, special_tokens
from gptedge.runtime.serving.engine import (CompletionRequest, EngineStoppedError, FinishReason,
                                            QueueFullError, TokenEvent)

from .chat_app import ChatRoute
from .classify_app import ClassifyApi
from .classify_schema import generation_card
from .completion_choices import ChoiceState, choice_sampling, returned, seeded
from .event_stream import EventStream, Job
from .limits import ClientGone, check_prompt_bytes, longest_token_bytes, parse_json, read_body
from .off_loop import off_loop_unless_small, text_chars
from .openai_schema import (ApiError, Completion, CompletionParams, Logprobs, choice, error_body, model_card,
                            parse_completion_request)
from .routes import RETRY_AFTER_S, Classifying, Generating, Routes, ServeState, _wait_disconnect
from .structured import Constraints, requested_constraint

# RETRY_AFTER_S and the state classes live in routes.py; callers import them here
__all__ = ["RETRY_AFTER_S", "Classifying", "Generating", "ServeState", "create_app"]

log = logging.getLogger(__name__)


def _dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


_MARK = "\x00gptedge-text\x00"  # stands for a chunk's text in its template; no model name or id holds it
_encode_text = json.encoder.encode_basestring  # what _dumps does to a str (ensure_ascii=False)


def _text_chunk(out: Completion, templates: dict[int, tuple[str, str]], index: int, text: str) -> str:
    """_dumps(out.chunk(index, text)), the chunk a stream sends per token, without building and encoding its
    envelope each time: the envelope is encoded once per choice around a marker (`templates` keeps it), then only
    the text is encoded into it."""
    parts = templates.get(index)
    if parts is None:
        parts = tuple(_dumps(out.chunk(index, _MARK)).split(_dumps(_MARK)))
        if len(parts) != 2:  # the marker elsewhere too: no template for this one
            return _dumps(out.chunk(index, text))
        templates[index] = parts
    return parts[0] + _encode_text(text) + parts[1]


def _engine_logprobs(top: int | None, ranked: bool = False) -> int:
    """The engine's logprobs count for an API's top-N (None: off): it reports logprobs with N >= 1; `ranked`
    (best_of > n) needs every token's logprob too."""
    return 0 if top is None and not ranked else max(top or 0, 1)


def _failure(event: TokenEvent) -> ApiError | None:
    if event.finish_reason == FinishReason.CANCELLED:
        return ApiError(503, "the server shut down before this completion finished", "server_error",
                        code="shutting_down")
    if event.finish_reason == FinishReason.ERROR:
        return ApiError(500, f"generation failed: {event.error}", "server_error")
    return None


class Api(Routes):
    """A language model's routes: parse and check a request, hand it to the engine, shape the answer (never the
    session)."""

    def __init__(self, state: ServeState):
        super().__init__(state)
        served: Generating = state.served
        self.model, self.engine, self.max_tokens_limit = served.model, served.engine, served.max_tokens_limit
        self.context = self.model.manifest.shape.context_length
        tokenizer = self.model.tokenizer
        # no text longer than this fits the context: each token covers at most the longest token's bytes
        self.max_prompt_bytes = self.context * longest_token_bytes(tokenizer, self.model.manifest.shape.vocab_size)
        # a token's own text, for logprobs: cached, the same ids recur
        self.token_text = functools.lru_cache(maxsize=65536)(
            lambda token_id: tokenizer.decode([token_id], skip_special_tokens=False))
        self.constraints = Constraints(self.model)  # structured output: compiled before admission
        model_dir = self.model.model_dir
        self.chat = ChatRoute(self, served.chat_template or find_chat_template(model_dir), special_tokens(model_dir))

    def prompt_ids(self, params: CompletionParams) -> list[list[int]]:
        """Each prompt's ids (tokenizer work: off the event loop unless short). The engine checks them (submit)."""
        return [self.model.encode_prompt(p) if isinstance(p, str) else list(p) for p in params.prompts]

    def echoes(self, params: CompletionParams, ids: list[list[int]]) -> list[tuple[str, list[int] | None]]:
        """Each prompt's echoed text ('' without echo) and, with echo and logprobs, its tokens' offsets in it:
        tokenizer work too (off the event loop unless short), once the engine has checked the ids."""
        scored = params.echo and params.logprobs is not None
        return [(self.model.decode(p) if params.echo else "",
                 token_offsets(self.model.tokenizer, p) if scored else None) for p in ids]

    def submit(self, params: CompletionParams, ids: list[list[int]], constraint=None) -> Job:
        """best_of engine requests per prompt, prompt-major (completion_choices.py); each choice's row gets its
        own matcher of the one compiled constraint."""
        logprobs = _engine_logprobs(params.logprobs, params.best_of > params.n)
        return self._submit([CompletionRequest(tuple(p), params.max_tokens, sampling, params.stop, logprobs,
                                               params.ignore_eos, constraint=constraint,
                                               prompt_logprobs=params.prompt_logprobs)
                             for p in ids for sampling in choice_sampling(params)])

    def submit_ids(self, ids: list[int], max_tokens: int, sampling, stop: tuple[str, ...], logprobs: int | None,
                   ignore_eos: bool, stop_ids: tuple[int, ...] = (), n: int = 1, constraint=None) -> Job:
        """One prompt's engine requests, one per choice (the chat route's)."""
        return self._submit([CompletionRequest(tuple(ids), max_tokens, choice, stop, _engine_logprobs(logprobs),
                                               ignore_eos, stop_ids, constraint=constraint)
                             for choice in seeded(sampling, n)], "messages", "conversation")

    failure = staticmethod(lambda event: _failure(event))
    dumps = staticmethod(lambda obj: _dumps(obj))
    event_stream = staticmethod(lambda job, chunks: EventStream(job, chunks))

    def _submit(self, requests: list[CompletionRequest], param: str = "prompt", what: str = "prompt") -> Job:
        """Queue the requests, all or none; the engine's refusals (a prompt too long, an id outside the vocabulary)
        as 400s naming `param`."""
        if self.state.stopping:
            raise ApiError(503, "the server is shutting down", "server_error", code="shutting_down")
        job = Job(self.engine)
        try:
            job.submit(requests)
        except PromptTooLongError as e:
            raise ApiError(400, f"{e}; shorten the {what}", param=param, code="context_length_exceeded") from None
        except InvalidArgumentError as e:
            raise ApiError(400, str(e), param=param) from None
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
        fields = parse_json(body, limits)
        params = parse_completion_request(fields, self.max_tokens_limit)
        asked = requested_constraint(fields)  # response_format / regex / grammar
        del body, fields
        self.check_model(params.model)
        check_prompt_bytes(params.prompts, self.max_prompt_bytes)
        # tokenizer work: off the event loop unless the text is short
        ids = await off_loop_unless_small(text_chars(params.prompts), self.prompt_ids, params)
        constraint = await run_in_threadpool(self.constraints.compile, asked) if asked else None
        job = self.submit(params, ids, constraint)  # the engine checks every prompt, then queues them all (or none)
        try:  # without echo no tokenizer work: on the loop
            echoes = (self.echoes(params, ids) if not params.echo
                      else await off_loop_unless_small(sum(map(len, ids)), self.echoes, params, ids))
        except BaseException:  # the client left while the echo decoded: nobody reads this job
            job.cancel()
            raise
        choices = [ChoiceState(echo, Logprobs() if params.logprobs is not None else None, offsets)
                   for echo, offsets in echoes for _ in range(params.best_of)]
        out = Completion(self.state.name)
        if params.stream:
            templates: dict[int, tuple[str, str]] = {}  # each choice's text chunk, encoded once (_text_chunk)
            plain = (None if params.logprobs is not None  # with logprobs every event carries an entry: no fast lane
                     else functools.partial(self.plain_chunk, choices, out, templates))
            return EventStream(job, functools.partial(self.stream_chunks, job, params, choices, out, ids, templates),
                               plain)
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
            [choice(i, c.echo + c.text, c.finish_reason, c.logprobs) for i, c in enumerate(returned(params, choices))],
            sum(map(len, ids)), sum(c.completion_tokens for c in choices)))

    async def stream_chunks(self, job: Job, params: CompletionParams, choices: list[ChoiceState], out: Completion,
                            ids: list[list[int]], templates: dict[int, tuple[str, str]], gone) -> AsyncIterator[str]:
        """Streams only when best_of == n: choice i is engine request i."""
        for i, c in enumerate(choices):
            if c.echo and c.prompt_offsets is None:  # an echo with logprobs waits for them (its first event)
                yield _dumps(out.chunk(i, c.echo))
        async for i, event in job.events(gone):
            if (failure := _failure(event)) is not None:
                yield _dumps(failure.body())  # the openai client raises APIError on it
                return
            prompt, entry = choices[i].take(event, self.token_text, params.logprobs)
            if prompt is not None:
                yield _dumps(out.chunk(i, choices[i].echo, None, prompt))
            if entry is None and event.finish_reason is None:
                if event.text:  # the chunk of nearly every token
                    yield _text_chunk(out, templates, i, event.text)
            else:
                yield _dumps(out.chunk(i, event.text, event.finish_reason, entry))
        if params.include_usage:
            yield _dumps(out.usage_chunk(sum(map(len, ids)), sum(c.completion_tokens for c in choices)))
        yield "[DONE]"

    def plain_chunk(self, choices: list[ChoiceState], out: Completion, templates: dict[int, tuple[str, str]],
                    index: int, event: TokenEvent) -> str | None:
        """What stream_chunks sends for a plain token's event (no finish, no prompt logprobs; the stream asked for
        no logprobs): its text chunk, or "" for an event without text; None for any other event. The stream's fast
        lane (event_stream.py) calls it on the loop instead of waking stream_chunks."""
        if event.finish_reason is not None or event.prompt_logprobs is not None:
            return None
        choices[index].take(event, self.token_text, None)  # without logprobs: adds the text, returns (None, None)
        return _text_chunk(out, templates, index, event.text) if event.text else ""

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
    if isinstance(state.served, Classifying):
        api = ClassifyApi(state)  # a classifier dir: /v1/classify, and /v1/completions refused
        posts = [Route("/v1/completions", api.refuse, methods=["POST"]),
                 Route("/v1/chat/completions", api.refuse, methods=["POST"]),
                 Route("/v1/classify", api.classify, methods=["POST"])]
    else:
        api = Api(state)
        posts = [Route("/v1/completions", api.completions, methods=["POST"]),
                 Route("/v1/chat/completions", api.chat.handle, methods=["POST"]),
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

    PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/classify", "/v1/models", "/health", "/metrics")

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
