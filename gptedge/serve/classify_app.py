"""A classifier dir's routes: POST /v1/classify (classify_schema.py's shapes), and the shared ones (app.Routes).

The route checks and tokenizes a request's examples in a worker thread (so the event loop keeps answering),
then hands their token rows to the batching worker (classify_batcher.py), which gathers concurrent
requests into shared ONNX Runtime runs, and awaits its results or the client's leaving (then the job is
cancelled and its rows never run; a 499 as for completions). Errors are completions': the same JSON, the
API key first (401), 400 for a bad example (naming its index), 413 for too many, 429 when the queue is
full, 503 while shutting down.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gptedge.runtime.errors import InvalidArgumentError, PromptTooLongError
from gptedge.runtime.modeldir.tasks import CHOICES, COMBINE_CHOICES, example_fields
from gptedge.runtime.serving.classify_batcher import BatcherQueueFull, BatcherStopped, ClassifyJob

from .classify_schema import classification, describe_example, parse_classify_request, task_card, text_fields
from .limits import ClientGone, longest_token_bytes, parse_json, read_body
from .openai_schema import ApiError, model_card
from .routes import RETRY_AFTER_S, Classifying, Routes, ServeState, _wait_disconnect


def _shutting_down() -> ApiError:
    return ApiError(503, "the server is shutting down", "server_error", code="shutting_down")


class ClassifyApi(Routes):
    def __init__(self, state: ServeState):
        super().__init__(state)
        served: Classifying = state.served
        self.classifier, self.batcher, self.max_examples = served.classifier, served.batcher, served.max_examples
        self.task = self.classifier.task
        self.context = self.classifier.manifest.shape.context_length
        self.choice = self.task.transformation.combine == COMBINE_CHOICES
        labels = self.task.labels()
        self.keyed = not self.choice and len(set(labels)) == len(labels)  # probabilities as {label: p}
        # no text longer than this fits the context: each token covers at most the longest token's bytes
        self.max_text_bytes = self.context * longest_token_bytes(self.classifier.tokenizer,
                                                                 self.classifier.manifest.shape.vocab_size)

    def card(self) -> dict:
        return {**model_card(self.state.name, self.state.created), **task_card(self.task, self.context)}

    def metric_lines(self) -> list[str]:
        return self.batcher.metrics.render()

    def prepare(self, examples) -> tuple[list, list | None]:
        """Examples as sent -> (each one's token rows, multiple choice: each one's choices); a 400 naming the
        first bad example. Texts too long to fit are refused by their bytes before they are tokenized."""
        all_rows, choices = [], [] if self.choice else None
        for i, example in enumerate(examples):
            try:
                fields = example_fields(self.task, example)
                for text in text_fields(fields):
                    if len(text.encode("utf-8")) > self.max_text_bytes:  # parse_json checked: it encodes
                        raise PromptTooLongError(f"a text of {len(text.encode('utf-8')):,} bytes cannot fit the "
                                                 f"model's {self.context} positions")
                all_rows.append(self.classifier.example_rows(fields))
            except PromptTooLongError as e:
                raise ApiError(400, f"input[{i}]: {e}; shorten it", param="input",
                               code="context_length_exceeded") from None
            except InvalidArgumentError as e:
                raise ApiError(400, f"input[{i}]: {e} ({describe_example(self.task)})", param="input") from None
            if choices is not None:
                choices.append(list(fields[CHOICES]))
        return all_rows, choices

    async def classify(self, request: Request) -> Response:
        self.authorize(request)  # before a byte of the body is read
        if self.state.stopping:
            raise _shutting_down()
        limits = self.state.limits
        body = await read_body(request.receive, request.headers, limits, lambda: self.state.stopping,
                               self.state.dropped)
        params = parse_classify_request(parse_json(body, limits), self.task, self.max_examples)
        del body
        if params.model is not None:
            self.check_model(params.model)
        rows, choices = await run_in_threadpool(self.prepare, params.examples)  # tokenizing: off the event loop
        created = int(time.time())
        results = await self.run(request, rows, choices)
        if results is None:
            return Response(status_code=499)  # the client left; nobody reads this
        return JSONResponse({
            "id": f"clf-{uuid.uuid4().hex}", "object": "classification", "created": created, "model": self.state.name,
            "data": [classification(i, r, self.keyed) for i, r in enumerate(results)],
            "usage": {"prompt_tokens": (n := sum(len(r) for ex in rows for r in ex)), "total_tokens": n}})

    async def run(self, request: Request, rows: list, choices: list | None) -> list | None:
        """Queue the rows on the batcher and await their results (None: the client left, the job is cancelled)."""
        if self.state.stopping:
            raise _shutting_down()
        loop = asyncio.get_running_loop()
        answer: asyncio.Future = loop.create_future()

        def done(results, error) -> None:  # on the batcher's thread
            def settle() -> None:
                if not answer.done():
                    answer.set_exception(error) if error is not None else answer.set_result(results)
            try:
                loop.call_soon_threadsafe(settle)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

        try:
            job = self.batcher.submit(ClassifyJob(rows, choices, done))
        except BatcherQueueFull as e:
            raise ApiError(429, f"the server is busy ({e}); retry shortly", "rate_limit_error", code="queue_full",
                           headers={"Retry-After": str(RETRY_AFTER_S)}) from None
        except BatcherStopped:
            raise _shutting_down() from None
        gone = asyncio.ensure_future(_wait_disconnect(request.receive))
        try:
            await asyncio.wait((answer, gone), return_when=asyncio.FIRST_COMPLETED)
            if not answer.done():
                job.cancel()
                raise ClientGone()
            return answer.result()
        except ClientGone:
            return None
        except BatcherStopped:
            raise ApiError(503, "the server shut down before this request ran", "server_error",
                           code="shutting_down") from None
        except Exception as e:  # the run failed: one line, the server keeps serving
            why = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
            raise ApiError(500, f"classification failed: {why}", "server_error") from None
        finally:
            gone.cancel()
