"""POST /v1/chat/completions: the messages rendered with the checkpoint's chat template, then served as a
completion by the same engine (docs/serving.md#chat-completions).

The template is the model dir's (chat_template.jinja, copied at export from the checkpoint's tokenizer files) or
`gptedge serve --chat-template FILE`; a model without one answers this route with a one-line 400. Rendering runs
transformers' Jinja semantics, sandboxed (runtime/modeldir/chat_template.py), off the event loop with the
tokenization; the rendered text is tokenized without adding special tokens (the template writes them). A turn
ends at the model's end-of-text or at the tokenizer's own end-of-sequence token (tokenizer_config.json's
eos_token: a chat model's end of turn, `<|im_end|>` say), and at `stop` strings.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gptedge.runtime.modeldir.chat_template import ChatTemplateError, render_chat

from .chat_schema import ChatCompletion, ChatParams, parse_chat_request, token_logprob
from .limits import ClientGone, check_prompt_bytes, parse_json, read_body
from .off_loop import message_chars, off_loop_unless_small
from .openai_schema import ApiError
from .routes import _wait_disconnect
from .structured import requested_constraint


class ChatRoute:
    """/v1/chat/completions of one served language model (`api`: app.Api, whose engine, limits and checks it uses)."""

    def __init__(self, api, template: str | None, tokens: dict[str, str]):
        self.api, self.template, self.tokens = api, template, tokens
        tokenizer = api.model.tokenizer
        eos = tokenizer.token_to_id(tokens["eos_token"]) if "eos_token" in tokens else None
        self.stop_ids = () if eos is None else (eos,)

    def prompt_ids(self, params: ChatParams) -> list[int]:
        """Render and tokenize (tokenizer work: off the event loop unless the messages are short)."""
        try:
            text = render_chat(self.template, params.messages, params.add_generation_prompt, self.tokens)
        except ChatTemplateError as e:
            raise ApiError(400, str(e), param="messages", code="chat_template_error") from None
        return self.api.model.tokenizer.encode(text, add_special_tokens=False).ids  # the engine checks them (submit)

    async def handle(self, request: Request) -> Response:
        api, state = self.api, self.api.state
        api.authorize(request)
        if state.stopping:
            raise ApiError(503, "the server is shutting down", "server_error", code="shutting_down")
        body = await read_body(request.receive, request.headers, state.limits, lambda: state.stopping, state.dropped)
        fields = parse_json(body, state.limits)
        params = parse_chat_request(fields, api.max_tokens_limit)
        asked = requested_constraint(fields)  # response_format / regex / grammar
        del body, fields
        api.check_model(params.model)
        if self.template is None:
            raise ApiError(400, f"'{state.name}' has no chat template: send plain text to POST /v1/completions, or "
                                "start the server with --chat-template FILE", param="messages",
                           code="no_chat_template")
        check_prompt_bytes(tuple(str(m.get("content") or "") for m in params.messages), api.max_prompt_bytes)
        ids = await off_loop_unless_small(message_chars(params.messages), self.prompt_ids, params)
        constraint = await run_in_threadpool(api.constraints.compile, asked) if asked else None
        job = api.submit_ids(ids, params.max_tokens, params.sampling, params.stop, params.top_logprobs,
                             params.ignore_eos, self.stop_ids, params.n, constraint)
        out = ChatCompletion(state.name)
        if params.stream:
            return api.event_stream(job, functools.partial(self.stream_chunks, job, params, out, len(ids)))
        gone = asyncio.ensure_future(_wait_disconnect(request.receive))
        texts, finish = [""] * params.n, [None] * params.n
        entries = [[] if params.top_logprobs is not None else None for _ in range(params.n)]
        produced = 0
        try:
            async for i, event in job.events(gone):
                if (failure := api.failure(event)) is not None:
                    raise failure
                texts[i] += event.text
                if entries[i] is not None and event.token_id is not None:
                    entries[i].append(self._logprob(event, params.top_logprobs))
                if event.finish_reason is not None:
                    finish[i] = str(event.finish_reason)
                    produced += len(event.generation.ids) if event.generation is not None else 0
        except ClientGone:
            return Response(status_code=499)
        finally:
            gone.cancel()
            job.cancel()
        return JSONResponse(out.response_n(list(zip(texts, finish, entries, strict=True)), len(ids), produced))

    def _logprob(self, event, top_n: int) -> dict:
        name = self.api.token_text
        top = {name(t): lp for t, lp in list((event.top_logprobs or {}).items())[:top_n]}
        return token_logprob(name(event.token_id), event.logprob, top)

    async def stream_chunks(self, job, params: ChatParams, out: ChatCompletion, prompt_tokens: int,
                            gone) -> AsyncIterator[str]:
        _dumps = self.api.dumps
        for i in range(params.n):
            yield _dumps(out.chunk({"role": "assistant", "content": ""}, index=i))
        produced = 0
        async for i, event in job.events(gone):
            if (failure := self.api.failure(event)) is not None:
                yield _dumps(failure.body())
                return
            entry = None
            if params.top_logprobs is not None and event.token_id is not None:
                entry = [self._logprob(event, params.top_logprobs)]
            if event.text or entry is not None:
                yield _dumps(out.chunk({"content": event.text}, None, entry, index=i))
            if event.finish_reason is not None:
                produced += len(event.generation.ids) if event.generation is not None else 0
                yield _dumps(out.chunk({}, str(event.finish_reason), index=i))
        if params.include_usage:
            yield _dumps(out.usage_chunk(prompt_tokens, produced))
        yield "[DONE]"
