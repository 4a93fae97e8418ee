"""A completion request's checks before it is queued, and the fresh per-sequence state it starts from.

The engine is the one place a request is validated (the HTTP layer, Ray and the Python API all submit through it);
every check here raises at once, on the caller's thread, before anything is queued (engine.submit_all: all or
nothing).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import InvalidArgumentError
from ..generation.arguments import check_int
from ..generation.generation import Generation, SequenceState, check_prompts
from ..generation.text_stream import TextStream
from ..model import LoadedModel
from .requests import CompletionRequest, TokenEvent


def checked_state(model: LoadedModel, pool: object, tokenizer: object | None, request: CompletionRequest,
                  on_event: Callable[[TokenEvent], None]) -> SequenceState:
    """-> the request's fresh SequenceState; raises TypeError / InvalidArgumentError / PromptTooLongError on the
    first problem. pool: the engine's sequence pool (whether it keeps prompt logits); tokenizer: None for a model
    without one (no text stream)."""
    if not isinstance(request, CompletionRequest):
        raise TypeError(f"submit() takes a CompletionRequest, got {type(request).__name__}")
    if not callable(on_event):
        raise TypeError(f"on_event must be callable, got {type(on_event).__name__}")
    m = model.manifest
    if request.prompt_logprobs is not None:
        if not getattr(pool, "keeps_prompt_logits", False):
            raise InvalidArgumentError("this model's graph and device do not compute prompt logprobs")
        check_int(request.max_new_tokens, "max_new_tokens", 0)  # 0: score the prompt only
    check_prompts([request.prompt_ids], max(request.max_new_tokens, 1) if request.prompt_logprobs is not None
                  else request.max_new_tokens, m.shape.context_length, m.shape.vocab_size)
    if request.constraint is not None and request.constraint.vocab_size != m.shape.vocab_size:
        raise InvalidArgumentError(f"the constraint was compiled for {request.constraint.vocab_size} tokens, "
                                   f"this model has {m.shape.vocab_size}")
    stream = TextStream(tokenizer, request.stop) if tokenizer is not None else None
    # a greedy row draws nothing (select_token): no generator, whose seeding from the OS cost ~50 us a request
    rng = None if request.sampling.is_greedy else np.random.default_rng(request.sampling.seed)
    return SequenceState(Generation(prompt_ids=list(request.prompt_ids)), stream, rng, list(request.prompt_ids))
