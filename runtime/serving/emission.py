"""A row's next token turned into its event, on the engine thread (docs/design.md#serving): the token selected from
the logits (or the one the device picked), the logprobs asked for, generate()'s stop checks, a constraint's advance,
the latency metrics, and the request's callback, which may raise without ending anyone else's request.

The engine (engine.py) decides which rows step and when; this decides what each row's token means for its request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from ..generation.evaluate import log_softmax
from ..generation.generation import STOP_CONTEXT, STOP_EOS, STOP_MAX_NEW, STOP_STRING
from ..generation.constraints import STOP_GRAMMAR
from ..generation.sampling import select_token
from ..model import LoadedModel
from .in_flight import Active
from .metrics import EngineMetrics
from .requests import FinishReason, RequestState, TokenEvent

log = logging.getLogger(__name__)


class Emission:
    def __init__(self, model: LoadedModel, metrics: EngineMetrics, token_text: Callable[[int], str] | None):
        """model: the LoadedModel (its manifest read at each token, as the engine's); token_text: a token id's own
        text (the logprobs' token names), None without a tokenizer."""
        self._model, self.metrics, self._token_text = model, metrics, token_text

    def next(self, active: Active, logits: np.ndarray | None, tok: int | None = None) -> None:
        """Select one token from logits (V,) (or take `tok`, picked on the device for a plain greedy row, logits
        None), report it, and mark the request done when it ends."""
        req, state, rule = active.request, active.state, active.constraint
        if tok is None:
            tok = select_token(logits if rule is None else rule.apply(logits), req.sampling, state.rng, state.seen)
        logprob, top = None, None
        if req.logprobs:
            logp = log_softmax(logits[None])[0]
            logprob = float(logp[tok])
            best = np.argpartition(-logp, req.logprobs)[: req.logprobs]
            top = {int(i): float(logp[i]) for i in best[np.argsort(-logp[best])]}
        manifest = self._model.manifest
        eos = None if req.ignore_eos else (manifest.stop_ids or None)
        piece = state.take(tok, eos, req.max_new_tokens, manifest.shape.context_length)
        if not req.ignore_eos and tok in req.stop_ids and state.result.stop != STOP_EOS:
            state.result.stop = STOP_EOS  # the end of a chat turn: a stop, whatever else take() found
        error = None
        if rule is not None and state.result.stop not in (STOP_EOS, STOP_STRING):
            if not rule.advance(tok):
                error = state.result.stop = f"constraint: {rule.error}"
            elif rule.done:
                state.result.stop = STOP_GRAMMAR  # the grammar is complete and allows nothing more: a stop
        now = time.perf_counter()
        first = not active.last_token_at
        self.metrics.observe_token(now - (active.submitted if first else active.last_token_at), first)
        active.last_token_at, active.pending = now, tok
        named = {}
        if req.logprobs and state.stream is not None:
            named = {"token_text": self._token_text(tok), "text_offset": state.stream.last_offset}
        if error is not None:
            self.finish(active, piece, tok, logprob, top, FinishReason.ERROR, error, named=named)
        elif state.result.stop:
            self.finish(active, piece, tok, logprob, top, named=named)
        else:
            self.deliver(active, TokenEvent(piece, tok, logprob, top, **named))

    def deliver(self, active: Active, event: TokenEvent) -> None:
        """Hand an event to its request's callback. A callback that raises ends its own request (cancelled at
        the next step boundary), never the batch: the others' events keep coming."""
        if active.prompt_logprobs is not None:  # the first event carries them
            event, active.prompt_logprobs = replace(event, prompt_logprobs=active.prompt_logprobs), None
        try:
            active.on_event(event)
        except Exception as e:  # the caller's code: anything may come out of it
            if not active.cancelled.is_set():
                log.warning("request %d: its event callback raised %s: %s; the request is cancelled",
                            active.seq, type(e).__name__, str(e).splitlines()[0][:200] if str(e) else "")
            active.cancelled.set()

    def finish(self, active: Active, piece: str, tok: int | None, logprob=None, top=None,
               reason: FinishReason | None = None, error: str | None = None, named: dict | None = None) -> None:
        r = active.state.result
        tail = active.state.stream.flush() if active.state.stream is not None and reason is None else ""
        if active.state.stream is not None:
            r.text = active.state.stream.text
        reason = reason or (FinishReason.LENGTH if r.stop in (STOP_MAX_NEW, STOP_CONTEXT) else FinishReason.STOP)
        active.status = RequestState.FINISHED
        self.metrics.finished(reason.value, len(r.ids))
        self.deliver(active, TokenEvent(piece + tail, tok, logprob, top, reason, r, error, **(named or {})))
