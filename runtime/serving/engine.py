"""The serving engine: one thread owns the model's session and runs continuous batching (docs/design.md#serving).

Requests queue up (at most `max_queue` waiting). Each loop turn runs one prefill run, then one
decode step of the running batch, so a running row waits at most one prefill run (of at most
`prefill_chunk` prompt positions, padding counted) between two tokens. The run prefills together as
many newcomers as have rows and fit the budget (k prompts padded to the longest: k x longest <=
prefill_chunk; a burst of short prompts costs one run, not one each), or the next chunk of one
prompt too long for the budget alone: admission.plan_prefill decides which, as plain data (no model
needed to test it), and this module carries the plan out. A prompt that starts with whole blocks of an earlier
one takes their keys and values from the prefix cache (prefix_cache.py; the plan counts only the positions that
run) and the blocks it adds are stored once it is prefilled. Newcomers join the running batch at the step boundary; a
sequence leaves the batch when it ends or is cancelled, and its room is reused. Each step decodes
every joined sequence at once through the graph variant's sequence pool. Token selection, stop
handling and text streaming are generate()'s own (`generation.SequenceState`, applied by emission.py), so a request gets
the tokens `generate` gives for the same prompt and settings whatever else is in the batch (fp32; INT8 within its batch
invariance). Events reach the caller through its callback, on the engine thread: keep it short
(the HTTP layer hands them to its event loop).

Each request has an explicit state (RequestState: waiting -> prefilling -> running -> finished, as
llama.cpp's server gives each slot one), set where it moves, and ends with a FinishReason.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from ..errors import InvalidArgumentError
from ..generation.arguments import check_int
from ..generation.constraints import MaskWorker
from ..generation.generation import SequenceState
from ..generation.generation_options import PREFILL_CHUNK, PREFIX_CACHE_MB
from ..generation.text_stream import token_text
from ..graphs.sequence_pool import pool_for
from ..model import LoadedModel
from .admission import PrefillPlan, holds_newcomers, plan_prefill
from .emission import Emission
from .metrics import EngineMetrics
from .prefix_cache import PrefixReuse
from .prompt_logprobs import prompt_logprobs
from .in_flight import Active, RequestHandle, needs_logits
from .request_checks import checked_state
from .requests import CompletionRequest, EngineStoppedError, FinishReason, QueueFullError, RequestState, TokenEvent
from .step_ahead import StepAhead

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, model: LoadedModel, max_batch: int = 8, max_queue: int = 64,
                 prefill_chunk: int | None = PREFILL_CHUNK, prefix_cache_mb: float = PREFIX_CACHE_MB,
                 prefill_hold_ms: float = 0.0):
        """prefill_hold_ms: how long newcomers may wait while rows run, to share a prefill run (admission.py,
        holds_newcomers); 0: never held."""
        if not isinstance(model, LoadedModel):
            raise TypeError(f"Engine() takes a loaded model (gptedge.runtime.load(DIR)), got {type(model).__name__}")
        max_batch, max_queue = check_int(max_batch, "max_batch", 1), check_int(max_queue, "max_queue", 0)
        if prefill_chunk is not None:
            prefill_chunk = check_int(prefill_chunk, "prefill_chunk", 1)
        self.model, self.max_batch, self.max_queue, self.prefill_chunk = model, max_batch, max_queue, prefill_chunk
        shape = model.manifest.shape
        self.pool = pool_for(model.variant, max_batch, shape.context_length)
        if (isinstance(prefill_hold_ms, bool) or not isinstance(prefill_hold_ms, (int, float))
                or not 0 <= prefill_hold_ms < float("inf")):
            raise InvalidArgumentError(f"prefill_hold_ms must be a number >= 0, got {prefill_hold_ms!r}")
        self.prefill_hold_s = prefill_hold_ms / 1000
        self._picks = hasattr(self.pool, "step_picked")  # the GPU's pool: greedy rows picked on the device
        # ... and the next step run while this one's tokens are emitted, when every row was picked there
        self._ahead = StepAhead(self.pool) if self._picks else None
        self.metrics = EngineMetrics()
        self._masks = MaskWorker()  # constrained rows' next masks, computed while the step runs
        self.prefix = self._prefix_reuse(prefix_cache_mb)  # None: every prompt is prefilled from its first token
        self._tokenizer = model.tokenizer if model.has_tokenizer else None
        text_of = None
        if self._tokenizer is not None:  # cached: the same ids recur
            text_of = functools.lru_cache(maxsize=65536)(functools.partial(token_text, self._tokenizer))
        self._emission = Emission(model, self.metrics, text_of)  # a row's token -> its request's event
        self._cond = threading.Condition()
        self._waiting: deque[Active] = deque()
        self._running: list[Active] = []
        self._prefilling: tuple[Active, object] | None = None
        self._group: list[Active] = []  # newcomers off the queue, in a prefill run (a failed run fails them too)
        self._ids = itertools.count(1)
        self._accepting = True
        self._deadline: float | None = None  # set by stop(): cancel whatever still runs then
        self._thread = threading.Thread(target=self._loop, name="gptedge-engine", daemon=True)

    def _prefix_reuse(self, cap_mb: float) -> PrefixReuse | None:
        if isinstance(cap_mb, bool) or not isinstance(cap_mb, (int, float)) or not 0 <= cap_mb < float("inf"):
            raise InvalidArgumentError(f"prefix_cache_mb must be a number >= 0, got {cap_mb!r}")
        if not cap_mb:
            return None
        if not getattr(self.pool, "reuses_prefixes", False):
            log.info("prefix reuse is off: %s cannot start a sequence from cached keys and values",
                     type(self.pool).__name__)
            return None
        reuse = PrefixReuse(self.pool, int(cap_mb * 2**20))
        self.metrics.sources.append(reuse.cache.render)
        return reuse

    # -- the caller's side (any thread) -------------------------------------------------------------------
    def start(self) -> Engine:
        self._thread.start()
        return self

    def submit(self, request: CompletionRequest, on_event: Callable[[TokenEvent], None]) -> RequestHandle:
        """Queue a request; raises InvalidArgumentError / PromptTooLongError / QueueFullError at once.

        on_event is called on the engine thread with each TokenEvent; should it raise, this request ends
        (cancelled at the next step, the error logged) and every other request goes on."""
        return self.submit_all([request], [on_event])[0]

    def submit_all(self, requests: Sequence[CompletionRequest],
                   on_events: Sequence[Callable[[TokenEvent], None]]) -> list[RequestHandle]:
        """Queue several requests (one HTTP request's prompts), all or nothing: every one is checked before any
        is queued (the engine is the one place a request is validated), and when one is refused (queue full,
        shutting down) those already queued are cancelled before the error is raised."""
        if len(requests) != len(on_events):
            raise TypeError(f"submit_all() takes one on_event per request, got {len(on_events)} for {len(requests)}")
        states = [checked_state(self.model, self.pool, self._tokenizer, r, e)
                  for r, e in zip(requests, on_events, strict=True)]
        handles: list[RequestHandle] = []
        try:
            for request, on_event, state in zip(requests, on_events, states, strict=True):
                handles.append(self._queue(request, on_event, state))
        except BaseException:
            for h in handles:
                h.cancel()
            raise
        return handles

    def _queue(self, request: CompletionRequest, on_event: Callable[[TokenEvent], None],
               state: SequenceState) -> RequestHandle:
        keys = self.prefix.keys(request.prompt_ids) if self.prefix else ()  # hashed here, off the engine thread
        with self._cond:
            if not self._accepting:
                raise EngineStoppedError("the server is shutting down")
            if len(self._waiting) >= self.max_queue:
                raise QueueFullError(f"{len(self._waiting)} requests are waiting (--max-queue {self.max_queue})")
            active = Active(request, on_event, state, time.perf_counter(), next(self._ids), keys=keys,
                             needs_logits=needs_logits(request))
            if request.constraint is not None:
                active.constraint = request.constraint.start(request.stop_ids)
            self._waiting.append(active)
            self.metrics.queue_depth = len(self._waiting)
            self._cond.notify()
        return RequestHandle(active)

    def stop(self, grace_s: float = 10.0) -> None:
        """Take no new requests; let running ones finish for up to grace_s, cancel the rest, join.
        An engine never started has only waiting requests: they are cancelled here."""
        with self._cond:
            self._accepting = False
            self._deadline = time.perf_counter() + grace_s
            self._cond.notify()
        if self._thread.ident is None:
            self._cancel_all()
            return
        self._thread.join()

    @property
    def busy(self) -> int:
        """Requests waiting, prefilling or running."""
        with self._cond:
            return self._unfinished()

    # -- the engine thread --------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._waiting or self._running or self._prefilling) and self._accepting:
                    self._cond.wait()
                if not self._accepting and (self._deadline_passed() or not self._unfinished()):
                    break
            try:
                if self._ahead is not None and self._ahead.out:  # the step launched last turn comes first
                    self._decode_step()
                    continue
                self._drop_cancelled()
                self._prefill_turn()
                if self._running:
                    self._decode_step()
            except Exception as e:  # a failed run fails what was in flight, and the engine goes on
                log.exception("engine step failed")
                if self._ahead is not None:
                    self._ahead.settle()
                self._fail_all(f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
        if self._ahead is not None:
            self._ahead.close()
        self._cancel_all()
        self._masks.close()

    def _unfinished(self) -> int:
        """Requests waiting, prefilling or running (the caller holds the lock)."""
        return len(self._waiting) + len(self._group) + len(self._running) + (self._prefilling is not None)

    def _deadline_passed(self) -> bool:
        return self._deadline is not None and time.perf_counter() >= self._deadline

    def _prefill_turn(self) -> None:
        """One prefill run, as admission.plan_prefill decides: a group of newcomers whose prompts fit the budget
        together, else the next chunk of one long prompt (started here when it heads the queue)."""
        plan, group = self._admit()
        if group:
            prefixes = self._prefixes(group)  # None when reuse is off: then the pool is called as it always was
            if not plan.chunked:
                self._group = list(group)  # a row leaves it once joined: one whose join fails is failed from there
                keep = [a.request.prompt_logprobs is not None for a in group]
                extra = ({} if prefixes is None else {"prefixes": prefixes}) | ({"keep_all": keep} if any(keep) else {})
                if getattr(self.pool, "pads_groups", False):  # what each row may come to hold: how much padding fits
                    context = self.model.manifest.shape.context_length
                    extra["room"] = [min(context, len(a.request.prompt_ids) + a.request.max_new_tokens) for a in group]
                seqs, prompts = [a.seq for a in group], [a.request.prompt_ids for a in group]
                if hasattr(self.pool, "prefill_group_picked"):  # first tokens picked on the device: tokens or logits
                    rows = self.pool.prefill_group_picked(seqs, prompts, [a.needs_logits for a in group], **extra)
                else:  # only what the pool is asked for: the GPU's takes fewer
                    rows = self.pool.prefill_group(seqs, prompts, **extra)
                for active, row in zip(group, rows, strict=True):
                    self._joined(active, row)
                    self._group.remove(active)
                return
            active = group[0]
            extra = ({} if prefixes is None else {"prefix": prefixes[0]}) | (
                {"keep_all": True} if active.request.prompt_logprobs is not None else {})
            self._prefilling = (active, self.pool.prefill(active.seq, active.request.prompt_ids, self.prefill_chunk,
                                                          **extra))
        if not plan.chunked:
            return
        active, runs = self._prefilling
        try:
            next(runs)
            return  # one chunk done; the running batch decodes before the next
        except StopIteration as done:
            logits = done.value
        self._joined(active, logits)
        self._prefilling = None  # only now: a join that fails leaves it where _fail_all finds it

    def _admit(self) -> tuple[PrefillPlan, list[Active]]:
        """This turn's plan, and the newcomers it admits taken off the queue's head (now prefilling)."""
        if self._prefilling is not None:  # the engine thread's own state: the queue is not read, no lock needed
            return plan_prefill(True, (), len(self._running), self.max_batch, self.prefill_chunk), []
        with self._cond:
            if self._holding():
                return plan_prefill(False, (), len(self._running), self.max_batch, self.prefill_chunk), []
            # a request scoring its prompt (prompt logprobs) runs every position: it reuses nothing
            waiting = ((len(a.request.prompt_ids), 0 if a.request.prompt_logprobs is not None
                        else self.prefix.reusable(a.request.prompt_ids, a.keys))
                       if self.prefix else len(a.request.prompt_ids) for a in self._waiting)
            plan = self._one_alone(plan_prefill(False, waiting, len(self._running), self.max_batch,
                                                self.prefill_chunk))
            group = [self._waiting.popleft() for _ in range(plan.admit)]
            self.metrics.queue_depth = len(self._waiting)
        for active, reused in zip(group, plan.reused or [0] * len(group), strict=True):
            active.reused = reused
            self.metrics.tokens_in += len(active.request.prompt_ids)
            active.status = RequestState.PREFILLING
        return plan, group

    def _one_alone(self, plan: PrefillPlan) -> PrefillPlan:
        """The plan cut before its second newcomer that scores its prompt (prompt logprobs), where the pool shares
        prefill runs (the GPU's, with its larger budget): such a prompt runs alone, a launch-bound run of its own,
        so a turn takes at most one of them beside one shared run, and running rows wait two runs, not dozens.
        The caller holds the lock (the queue is read)."""
        if plan.admit < 2 or not getattr(self.pool, "pads_groups", False):
            return plan
        head = itertools.islice(self._waiting, plan.admit)  # the newcomers the plan admits, from the queue's head
        alone = [i for i, a in enumerate(head) if a.request.prompt_logprobs is not None]
        if len(alone) < 2:
            return plan
        return replace(plan, admit=alone[1], reused=plan.reused[:alone[1]])

    def _holding(self) -> bool:
        """Newcomers wait for company (admission.holds_newcomers): they are queued, rows run, the pool's prefill
        runs are launch-bound."""
        waiting = self._waiting
        return bool(waiting) and holds_newcomers(len(waiting), time.perf_counter() - waiting[0].submitted,
                                                 len(self._running), self.max_batch, self.prefill_hold_s)

    def _prefixes(self, group: list[Active]) -> list[np.ndarray | None] | None:
        """Each newcomer's cached prefix (None: it reuses nothing) for the pool's prefill; None when reuse is off."""
        if self.prefix is None:
            return None
        return [self.prefix.take(a.keys, a.reused) for a in group]

    def _joined(self, active: Active, logits: np.ndarray | int) -> None:
        """A newcomer's prompt is in: its first token from logits (V,) (or the token itself, picked on the device),
        then it runs (or ends at once)."""
        if self.prefix is not None:  # its blocks not cached yet, before the row can leave
            self.prefix.store(active.seq, active.keys)
        req = active.request
        if req.prompt_logprobs is not None:
            active.prompt_logprobs = prompt_logprobs(self.pool.prompt_logits.pop(active.seq), req.prompt_ids,
                                                     req.prompt_logprobs)
            if req.max_new_tokens == 0:  # the prompt scored, nothing to generate
                self.pool.remove(active.seq)
                self._emission.finish(active, "", None, reason=FinishReason.LENGTH)
                self.metrics.running = len(self._running)
                return
        if isinstance(logits, (int, np.integer)):  # picked on the device
            self._emission.next(active, None, logits)
        else:
            self._emission.next(active, logits)
        if active.state.result.stop:
            self.pool.remove(active.seq)
        else:
            active.status = RequestState.RUNNING
            self._running.append(active)
        self.metrics.running = len(self._running)

    def _decode_step(self) -> None:
        if self._ahead is not None and self._ahead.out:  # run ahead over exactly these rows (and the leavers)
            picked = self._ahead.take()
            if picked is None:  # the chain ended with no step left: the next turn is an ordinary one
                return
            self._drop_cancelled()  # cancelled while their tokens were emitted: no token after a cancel
            selected = [(None, picked[a.seq]) for a in self._running]
        else:
            selected = self._step_now()
        if self._steps_ahead(selected):  # the next steps run on the GPU while these tokens are emitted
            self._ahead.launch([a.seq for a in self._running], np.array([tok for _, tok in selected], np.int64))
        elif self._ahead is not None:
            self._ahead.stop()  # its steps done come first next turn; then the pool is this thread's again
        for active, (row, tok) in zip(list(self._running), selected, strict=True):
            self._emission.next(active, row, tok)
            if active.state.result.stop:
                self._running.remove(active)
                if self.prefix is not None:  # what its row holds: the prompt and every token but the last
                    held = active.request.prompt_ids + tuple(active.state.result.ids[:-1])
                    self.prefix.store_finished(active.seq, held)
                if self._ahead is not None:
                    self._ahead.remove(active.seq)  # its slot freed once a step out is back
                else:
                    self.pool.remove(active.seq)
        if self._ahead is not None and not self._running:
            self._ahead.settle()  # every row ended: nothing will take the step out
        self.metrics.running = len(self._running)

    def _steps_ahead(self, selected: list[tuple[np.ndarray | None, int | None]]) -> bool:
        """Whether the next step may run before these tokens are emitted (step_ahead.py): every row picked on the
        device and not cancelled, nobody due to prefill (held, or no free row) or prefilling in chunks, no prefix cache
        reading rows, room for one more position in each."""
        return (self._ahead is not None and self.prefix is None and self._prefilling is None
                and (not self._waiting or self._holding() or len(self._running) >= self.max_batch)
                and all(tok is not None for _, tok in selected)
                and not any(a.cancelled.is_set() for a in self._running) and self._ahead.can_launch(len(self._running)))

    def _step_now(self) -> list[tuple[np.ndarray | None, int | None]]:
        """One step of the running rows -> per row (its logits (V,), None) to select from, or (None, the token
        picked on the device)."""
        # the constrained rows' next masks are computed on the MaskWorker's thread while the model runs
        masks = self._masks.begin([a.constraint for a in self._running if a.constraint is not None])
        seqs, fed = [a.seq for a in self._running], np.array([a.pending for a in self._running])
        try:
            if self._picks:
                needs = [a.needs_logits for a in self._running]
                picked, logits = self.pool.step_picked(seqs, fed, needs)
                rows = iter(() if logits is None else logits)
                selected = [(next(rows), None) if need else (None, int(tok)) for need, tok in zip(needs, picked,
                                                                                              strict=True)]
            else:
                selected = [(row, None) for row in self.pool.step(seqs, fed)]
        finally:
            if masks is not None:
                masks.result()
        return selected

    def _drop_cancelled(self) -> None:
        with self._cond:
            gone = [a for a in self._waiting if a.cancelled.is_set()]
            for a in gone:
                self._waiting.remove(a)
            self.metrics.queue_depth = len(self._waiting)
        if self._prefilling and self._prefilling[0].cancelled.is_set():
            gone.append(self._prefilling[0])
            self._prefilling = None
        for a in [a for a in self._running if a.cancelled.is_set()]:
            self._running.remove(a)
            gone.append(a)
        for a in gone:  # a running row's slot: once no step runs ahead over it
            (self.pool if self._ahead is None else self._ahead).remove(a.seq)
            self._emission.finish(a, "", None, reason=FinishReason.CANCELLED)
        self.metrics.running = len(self._running)

    def _in_flight(self) -> list[Active]:
        with self._cond:
            waiting = list(self._waiting)
            self._waiting.clear()
        flight = waiting + self._group + self._running + ([self._prefilling[0]] if self._prefilling else [])
        self._running, self._prefilling, self._group = [], None, []
        return flight

    def _fail_all(self, message: str) -> None:
        for a in self._in_flight():
            self.pool.remove(a.seq)
            self._emission.finish(a, "", None, reason=FinishReason.ERROR, error=message)

    def _cancel_all(self) -> None:
        for a in self._in_flight():
            self.pool.remove(a.seq)
            self._emission.finish(a, "", None, reason=FinishReason.CANCELLED)
