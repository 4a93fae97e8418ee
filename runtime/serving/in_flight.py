"""A request in the serving engine (runtime/serving/engine.py): its engine-side record from queue to finish, and the
handle its caller holds."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from ..generation.constraints import RowConstraint
from ..generation.generation import SequenceState
from .prompt_logprobs import PromptLogprobs
from .requests import CompletionRequest, RequestState, TokenEvent


@dataclass(eq=False)
class Active:
    request: CompletionRequest
    on_event: Callable[[TokenEvent], None]
    state: SequenceState
    submitted: float
    seq: int
    cancelled: threading.Event = field(default_factory=threading.Event)
    keys: tuple[bytes, ...] = ()  # its prompt's block keys for the prefix cache (prefix_cache.py), when on
    reused: int = 0  # prompt positions its prefill takes from the prefix cache
    pending: int = -1  # the sampled token the next step feeds
    last_token_at: float = 0.0
    status: RequestState = RequestState.WAITING
    constraint: RowConstraint | None = None  # its grammar's state and next mask (structured output)
    prompt_logprobs: PromptLogprobs | None = None  # computed at prefill, sent with the first event
    needs_logits: bool = True  # False: a plain greedy row (needs_logits), whose token a pool may pick on the device


def needs_logits(request: CompletionRequest) -> bool:
    """False for a row whose next token is the logits' argmax and needs nothing else from them (no logprobs, no
    grammar's mask, no repetition penalty): the pool may pick it where the logits are (select_token's greedy hot
    path). Decided once, when the request is queued."""
    return (request.constraint is not None or bool(request.logprobs) or not request.sampling.is_greedy
            or request.sampling.repetition_penalty != 1.0)


class RequestHandle:
    def __init__(self, active: Active):
        self._active = active

    @property
    def id(self) -> int:
        return self._active.seq

    def cancel(self) -> None:
        """Stop this request at the next step boundary (its room is freed there)."""
        self._active.cancelled.set()
