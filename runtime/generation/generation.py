"""The generation loop: prefill, then decode one token at a time with the KV cache.

Batches are left-padded; each row has its own random generator seeded with the same seed,
so a row's tokens do not depend on what else is in the batch.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import InvalidArgumentError, PromptTooLongError
from ..graphs.graph_variant import DecodeState, GraphVariant
from .arguments import check_ids
from .generation_options import PREFILL_CHUNK, is_count
from .sampling import SamplingParams, select_token
from .text_stream import TextStream

STOP_EOS = "eos"
STOP_STRING = "stop_string"
STOP_MAX_NEW = "max_new_tokens"
STOP_CONTEXT = "context"


@dataclass
class Generation:
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)  # generated ids (eos included when it ended the text)
    text: str | None = None  # generated text, cut before a stop string; None without a tokenizer
    stop: str = ""  # eos | stop_string | max_new_tokens | context
    time_to_first_token_s: float = 0.0
    decode_s: float = 0.0  # from the first generated token to the last
    tokens_per_s: float = 0.0  # decode rate over all rows of the batch it ran in

    def to_dict(self) -> dict:
        return {"prompt_ids": self.prompt_ids, "ids": self.ids, "text": self.text, "stop": self.stop,
                "time_to_first_token_s": self.time_to_first_token_s, "tokens_per_s": self.tokens_per_s}


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """-> input_ids, attention_mask, both (B, L) int64, shorter prompts padded on the left."""
    length = max(len(p) for p in prompts)
    ids = np.full((len(prompts), length), pad_id, dtype=np.int64)
    mask = np.zeros((len(prompts), length), dtype=np.int64)
    for b, p in enumerate(prompts):
        ids[b, length - len(p):] = p
        mask[b, length - len(p):] = 1
    return ids, mask


def positions(mask: np.ndarray) -> np.ndarray:
    """position_ids (B, T) for a left-padded mask: cumsum(mask) - 1, clipped at 0."""
    return np.clip(np.cumsum(mask, axis=-1) - 1, 0, None)


def prefill(state: DecodeState, ids: np.ndarray, mask: np.ndarray, chunk: int | None = PREFILL_CHUNK,
            argmax: bool = False) -> np.ndarray:
    """Run the left-padded prompt (B, L) into a fresh cache, `chunk` positions per run (None: one run)
    -> last-position logits (B, V), or with argmax the greedy tokens (B,); the state then holds all L positions."""
    pos = positions(mask)
    length = ids.shape[1]
    chunk = chunk or length
    for start in range(0, length, chunk):
        end = min(length, start + chunk)
        run = state.run_argmax if argmax and end == length else state.run  # only the last chunk picks tokens
        logits = run(np.ascontiguousarray(ids[:, start:end]), np.ascontiguousarray(mask[:, :end]),
                     np.ascontiguousarray(pos[:, start:end]))
    return logits


def check_prompts(prompts: Sequence[Sequence[int]], max_new_tokens: int, context_length: int,
                  vocab_size: int | None = None) -> None:
    """Prompts that fit the context with room for max_new_tokens >= 1; with vocab_size, their ids too (integers
    inside the vocabulary: ONNX Runtime's own error for one outside is a raw Gather failure)."""
    if not is_count(max_new_tokens) or max_new_tokens < 1:
        raise InvalidArgumentError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if not prompts:
        raise InvalidArgumentError("no prompt given")
    for p in prompts:
        if len(p) == 0:
            raise InvalidArgumentError("a prompt is empty: give at least one token")
        if len(p) >= context_length:
            raise PromptTooLongError(
                f"prompt is {len(p)} tokens; the model's context holds {context_length}, leaving no room for a "
                "new token"
            )
        if vocab_size is not None:
            check_ids(p, vocab_size, "prompt token ids")


@dataclass
class SequenceState:
    """One sequence while it generates (a row of generate_batch, or a request in the server's engine)."""

    result: Generation
    stream: TextStream | None
    rng: np.random.Generator | None  # None for a greedy row (nothing drawn)
    seen: list[int]  # prompt + generated ids: what a repetition penalty reads

    def take(self, tok: int, eos_id: int | tuple[int, ...] | None, max_new_tokens: int, context_length: int) -> str:
        """Record one new token -> the text it completes ("" when none); sets result.stop when done.
        eos_id: the end-of-sequence id, or every one where a model has several (Manifest.stop_ids)."""
        r = self.result
        r.ids.append(tok)
        self.seen.append(tok)
        piece = self.stream.push(tok) if self.stream is not None else ""
        if eos_id is not None and (tok in eos_id if isinstance(eos_id, tuple) else tok == eos_id):
            r.stop = STOP_EOS
        elif self.stream is not None and self.stream.stopped:
            r.stop = STOP_STRING
        elif len(r.ids) >= max_new_tokens:
            r.stop = STOP_MAX_NEW
        elif len(r.prompt_ids) + len(r.ids) >= context_length:
            r.stop = STOP_CONTEXT
        return piece


def run_generation(
    variant: GraphVariant, prompts: Sequence[Sequence[int]], params: SamplingParams, max_new_tokens: int,
    context_length: int, eos_id: int | tuple[int, ...] | None, pad_id: int, tokenizer=None,
                   stop_strings: Sequence[str] = (),
    prefill_chunk: int | None = PREFILL_CHUNK,
) -> Generator[tuple[int, str], None, list[Generation]]:
    """Yields (row, text piece) as text completes; returns one Generation per prompt."""
    check_prompts(prompts, max_new_tokens, context_length)
    max_new_tokens = int(max_new_tokens)  # a numpy integer as a plain int
    B = len(prompts)
    ids, mask = left_pad(prompts, pad_id)
    rows = [SequenceState(Generation(prompt_ids=list(p)), TextStream(tokenizer, stop_strings) if tokenizer else None,
                          np.random.default_rng(params.seed), list(p)) for p in prompts]
    start = time.perf_counter()
    # Room for every token this generation can write: a row stops at max_new_tokens or at the context, and the
    # shortest prompt's row (left-padded to ids.shape[1]) runs longest. Never max_new_tokens alone: -n 1e9 on a
    # kv_buffer graph would allocate a (B, heads, 1e9, head_dim) cache.
    state = variant.start(B, ids.shape[1] + min(max_new_tokens, context_length - min(len(p) for p in prompts)))
    # Plain greedy picks the tokens where the logits are (on a GPU only the ids come back); the rest reads logits.
    argmax = params.is_greedy and params.repetition_penalty == 1.0
    step = state.run_argmax if argmax else state.run
    logits = prefill(state, ids, mask, variant.prefill_chunk(B, prefill_chunk), argmax)  # (B, V), or (B,) ids
    first = None
    for _ in range(max_new_tokens):
        next_ids = np.full((B, 1), pad_id, dtype=np.int64)
        for b, row in enumerate(rows):
            if row.result.stop:
                continue  # finished rows keep feeding padding; their outputs are ignored
            tok = int(logits[b]) if argmax else select_token(logits[b], params, row.rng, row.seen)
            next_ids[b, 0] = tok
            piece = row.take(tok, eos_id, max_new_tokens, context_length)
            if piece:
                yield b, piece
        if first is None:
            first = time.perf_counter()
        if all(row.result.stop for row in rows):
            break
        mask = np.concatenate([mask, np.ones((B, 1), dtype=np.int64)], axis=1)  # (B, T + 1)
        pos = np.minimum(mask.sum(axis=1, keepdims=True) - 1, context_length - 1)  # finished rows stay in range
        logits = step(next_ids, mask, pos)
    end = time.perf_counter()
    decoded = sum(len(row.result.ids) - 1 for row in rows)
    for b, row in enumerate(rows):
        r = row.result
        if row.stream is not None:
            tail = row.stream.flush()
            if tail:
                yield b, tail
            r.text = row.stream.text
        r.time_to_first_token_s = first - start
        r.decode_s = end - first
        r.tokens_per_s = decoded / r.decode_s if r.decode_s > 0 else 0.0
    return [row.result for row in rows]
