"""What a caller hands the serving engine and gets back: a CompletionRequest (checked for types here, for ranges
against the model at Engine.submit), its TokenEvents, the FinishReason of its last one, the RequestState the engine
keeps for it, and the errors submit raises when the engine cannot take it. Plain data: the engine (engine.py) owns
the model and the batch."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from ..errors import GptEdgeError, InvalidArgumentError
from ..generation.arguments import check_bool, check_int, check_stop
from ..generation.constraints import Constraint
from ..generation.generation import Generation
from ..generation.sampling import SamplingParams
from .prompt_logprobs import PromptLogprobs

MAX_LOGPROBS = 100  # top alternatives one request may ask for per token


class FinishReason(str, Enum):
    """Why a request ended: its last TokenEvent's finish_reason (OpenAI's values, as strings in JSON)."""

    STOP = "stop"  # eos or a stop string
    LENGTH = "length"  # max_new_tokens or the context
    CANCELLED = "cancelled"  # by its handle (a client gone), or by the engine stopping
    ERROR = "error"  # a failed model run

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class RequestState(Enum):
    WAITING = "waiting"  # queued for a batch row
    PREFILLING = "prefilling"  # its prompt runs, a chunk per engine turn
    RUNNING = "running"  # decoding in the batch, a token per step
    FINISHED = "finished"  # its last event was sent


class QueueFullError(GptEdgeError):
    """The engine's waiting queue is full: try again later."""


class EngineStoppedError(GptEdgeError):
    """The engine is shutting down and takes no new requests."""


@dataclass(frozen=True)
class CompletionRequest:
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    sampling: SamplingParams = SamplingParams()
    stop: tuple[str, ...] = ()
    logprobs: int = 0  # top-N alternatives reported per token (0: none; the chosen token's logprob always)
    ignore_eos: bool = False
    stop_ids: tuple[int, ...] = ()  # more tokens that end it as eos does (a chat template's end of turn)
    constraint: Constraint | None = None  # structured output: each token drawn from the grammar's mask
    # the prompt's own logprobs with this many alternatives per token (None: not computed); max_new_tokens may
    # then be 0 (the prompt scored, nothing generated). See prompt_logprobs.py.
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        """Types checked here (TypeError naming the field); ranges against the model at submit()."""
        ids = self.prompt_ids
        if isinstance(ids, (str, bytes)) or not isinstance(ids, (tuple, list, np.ndarray)) or not all(
                isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in ids):
            raise TypeError(f"prompt_ids must be a sequence of integer token ids, got {ids!r:.60}")
        object.__setattr__(self, "prompt_ids", tuple(int(i) for i in ids))
        if not isinstance(self.sampling, SamplingParams):
            raise TypeError(f"sampling must be a SamplingParams, got {type(self.sampling).__name__}")
        object.__setattr__(self, "stop", check_stop(self.stop))
        check_int(self.logprobs, "logprobs", 0, MAX_LOGPROBS)
        check_bool(self.ignore_eos, "ignore_eos")
        if self.prompt_logprobs is not None:
            check_int(self.prompt_logprobs, "prompt_logprobs", 0, MAX_LOGPROBS)
        object.__setattr__(self, "stop_ids", tuple(int(i) for i in self.stop_ids))
        if self.constraint is not None and not isinstance(self.constraint, Constraint):
            raise TypeError(f"constraint must be a compiled Constraint, got {type(self.constraint).__name__}")
        if self.constraint is not None and self.ignore_eos:
            raise InvalidArgumentError("ignore_eos cannot be combined with a constraint (the grammar's end is eos)")


@dataclass(frozen=True)
class TokenEvent:
    text: str  # text this token completed ("" while a character or a possible stop string is held back)
    token_id: int | None = None
    logprob: float | None = None  # of the chosen token under the model's distribution (before sampling filters)
    top_logprobs: dict[int, float] | None = None
    finish_reason: FinishReason | None = None  # on the last event
    generation: Generation | None = None  # on the last event
    error: str | None = None
    prompt_logprobs: PromptLogprobs | None = None  # on the request's first event, when it asked for them
    # with logprobs: the token's own text and where it starts in the request's text (TextStream.last_offset), so
    # the text and the logprobs' tokens come from the engine's one decoding (docs/serving.md)
    token_text: str | None = None
    text_offset: int | None = None
