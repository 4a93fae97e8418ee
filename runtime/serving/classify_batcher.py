"""The classifier's batching worker: examples from concurrent /v1/classify requests share ONNX Runtime runs.

One thread owns the runs. Requests (`ClassifyJob`: each example's token rows, already tokenized off the
event loop) wait in a FIFO; the worker takes the first, then every waiting job that still fits in
`max_rows` rows, and runs them together as one `Classifier.classify_rows` call (rows padded to the
longest of that batch; the graph masks the padding). So requests that arrive while a run is in progress
are gathered into the next one, as the engine gathers completions into its decode steps, and no request
blocks the event loop. `wait_s` > 0 lets a batch wait that long for more rows before it runs (0: it runs
with what is already waiting). A job larger than `max_rows` runs alone, split into runs of `max_rows`.
A job is never split across batches and never overtaken: one that does not fit waits at the head.

Results go back through the job's `done(results, error)` callback, on this thread; the HTTP side
(gptedge/serve/classify_app.py) hands them to the event loop. Counters for /metrics: requests, examples,
batches (gathers) and rows.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


class BatcherQueueFull(Exception):
    """More requests are waiting than max_queue."""


class BatcherStopped(Exception):
    """The batcher is shutting down and takes no new requests."""


@dataclass(eq=False)
class ClassifyJob:
    rows: Sequence[list[list[int]]]  # per example, its token rows (1; similarity 2; multiple choice one a choice)
    choices: Sequence[Sequence[str]] | None  # multiple choice: each example's choice texts (its labels)
    done: Callable  # done(results: list[Classification] | None, error: BaseException | None), on the worker
    cancelled: bool = False  # the client left: skipped when gathered, its rows never run
    n_rows: int = field(init=False)

    def __post_init__(self) -> None:
        self.n_rows = sum(len(r) for r in self.rows)

    def cancel(self) -> None:
        self.cancelled = True


def _finish(job: ClassifyJob, results, error) -> None:
    """Hand a job its answer; a callback that raises is logged and ends only its own job, never the worker."""
    try:
        job.done(results, error)
    except Exception:
        log.exception("a classify job's callback failed")


class BatcherMetrics:
    """Written by the worker and the routes, read by /metrics (ints: a lock only for a consistent render)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = self.examples = self.batches = self.rows = self.queue_depth = 0

    def render(self) -> list[str]:
        with self.lock:
            values = [("requests", "counter", "Classify requests accepted into the queue.", self.requests),
                      ("examples", "counter", "Examples of those requests.", self.examples),
                      ("batches", "counter", "Batches run: each gathers the requests waiting when it starts.",
                       self.batches),
                      ("rows", "counter", "Token rows run (similarity: 2 an example; multiple choice: 1 a choice).",
                       self.rows),
                      ("queue_depth", "gauge", "Classify requests waiting for a batch.", self.queue_depth)]
        lines = []
        for name, kind, text, value in values:
            full = f"gptedge_classify_{name}" + ("_total" if kind == "counter" else "")
            lines += [f"# HELP {full} {text}", f"# TYPE {full} {kind}", f"{full} {value}"]
        return lines


class ClassifyBatcher:
    def __init__(self, classifier, max_rows: int = 32, max_queue: int = 64, wait_s: float = 0.0):
        self.classifier, self.max_rows, self.max_queue, self.wait_s = classifier, max_rows, max_queue, wait_s
        self.metrics = BatcherMetrics()
        self._queue: deque[ClassifyJob] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._running: list[ClassifyJob] = []
        self._thread = threading.Thread(target=self._loop, name="gptedge-classify", daemon=True)

    def start(self) -> ClassifyBatcher:
        self._thread.start()
        return self

    def submit(self, job: ClassifyJob) -> ClassifyJob:
        with self._cond:
            if self._stopping:
                raise BatcherStopped("the batcher is shutting down")
            if len(self._queue) >= self.max_queue:
                raise BatcherQueueFull(f"{len(self._queue)} requests waiting")
            self._queue.append(job)
            with self.metrics.lock:
                self.metrics.requests += 1
                self.metrics.examples += len(job.rows)
                self.metrics.queue_depth = len(self._queue)
            self._cond.notify_all()
        return job

    # -- the worker ----------------------------------------------------------------------------------------
    def _gather(self) -> list[ClassifyJob] | None:
        """The next batch (None: stopped and nothing is left): the head job, then those behind it that fit."""
        with self._cond:
            while True:
                while self._queue and self._queue[0].cancelled:
                    self._queue.popleft()
                if self._queue:
                    break
                if self._stopping:
                    return None
                self._cond.wait()
            batch = [self._queue.popleft()]
            rows = batch[0].n_rows
            deadline = time.monotonic() + self.wait_s
            while rows < self.max_rows:
                if self._queue:
                    job = self._queue[0]
                    if not job.cancelled and rows + job.n_rows > self.max_rows:
                        break  # it waits at the head for the next batch: never overtaken
                    self._queue.popleft()
                    if not job.cancelled:
                        batch.append(job)
                        rows += job.n_rows
                    continue
                left = deadline - time.monotonic()
                if left <= 0 or self._stopping:
                    break
                self._cond.wait(left)
            self._running = batch
            with self.metrics.lock:
                self.metrics.queue_depth = len(self._queue)
            return batch

    def _loop(self) -> None:
        while (batch := self._gather()) is not None:
            self._run(batch)
            with self._cond:
                self._running = []
                self._cond.notify_all()

    def _run(self, batch: list[ClassifyJob]) -> None:
        rows = [r for job in batch for r in job.rows]
        choices = [c for job in batch for c in job.choices] if batch[0].choices is not None else None
        try:
            results = self.classifier.classify_rows(rows, self.max_rows, choices)
        except Exception as e:  # one line to each waiting request; the server keeps serving
            log.exception("classification failed for a batch of %d requests", len(batch))
            for job in batch:
                _finish(job, None, e)
            return
        with self.metrics.lock:
            self.metrics.batches += 1
            self.metrics.rows += sum(job.n_rows for job in batch)
        at = 0
        for job in batch:
            _finish(job, results[at:at + len(job.rows)], None)
            at += len(job.rows)

    def stop(self, grace_s: float = 0.0) -> None:
        """Take no new requests; let those queued or running finish for up to grace_s; end the rest with
        BatcherStopped; join the worker."""
        deadline = time.monotonic() + grace_s
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            while (self._queue or self._running) and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            left_over, self._queue = list(self._queue), deque()
        for job in left_over:
            _finish(job, None, BatcherStopped("the server shut down before this request ran"))
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()
