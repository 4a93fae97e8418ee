"""Beam search, a numpy port of transformers' (4.57) vectorised `_beam_search`, so results match its
`generate(num_beams=N)`: same candidate count (2 x beams with an eos), same length-penalised score
sum(logprobs) / generated_length ** length_penalty, same early-stopping heuristic (False, True or
"never"). Each prompt's beams are rows b * K .. b * K + K - 1 of one batch; after each step the
cache rows are gathered to follow their beams (DecodeState.reorder: in place on the host, only the
rows that change). Beams carry no sampling, repetition penalty or stop strings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..graphs.graph_variant import GraphVariant
from .generation import check_prompts, left_pad, positions, prefill
from .generation_options import BeamOptions

NEG = np.float32(-1.0e9)  # transformers' "impossible" score


@dataclass
class BeamResult:
    prompt_ids: list[int]
    sequences: list[list[int]]  # best first; generated ids only, the eos included when it ended one
    scores: list[float]  # sum of log-probabilities / generated length ** length_penalty
    texts: list[str] | None = None


def _log_softmax32(logits: np.ndarray) -> np.ndarray:
    """(R, V) float32, in float32 as transformers computes it."""
    x = logits - logits.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def _top(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries of each row, largest first. (B, N) -> (B, k)"""
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(scores, part, axis=1), axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1)


def _gather(a: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """a (B, N, ...) rows idx (B, k) -> (B, k, ...)"""
    return a[np.arange(a.shape[0])[:, None], idx]


@dataclass
class _Beams:
    """Running and finished beams of every prompt. B prompts x K beams, tokens (B, K, max_new)."""

    running_seqs: np.ndarray
    running_scores: np.ndarray  # (B, K) float32, summed log-probabilities
    seqs: np.ndarray  # finished
    scores: np.ndarray  # (B, K) finished scores, length-penalised
    lengths: np.ndarray  # (B, K) generated length of each finished hypothesis
    finished: np.ndarray  # (B, K) bool
    improvable: np.ndarray  # (B, 1) bool: the early-stop heuristic still allows a better hypothesis


def beam_search(variant: GraphVariant, prompts: Sequence[Sequence[int]], max_new_tokens: int, context_length: int,
                eos_id: int | tuple[int, ...] | None, pad_id: int,
                options: BeamOptions = BeamOptions(),  # noqa: B008 - frozen: one shared default is safe
                prefill_chunk: int | None = None) -> list[BeamResult]:
    """eos_id: the end-of-sequence id, or every one where a model has several."""
    check_prompts(prompts, max_new_tokens, context_length)
    max_new_tokens = int(max_new_tokens)  # a numpy integer as a plain int
    eos_id = (eos_id,) if isinstance(eos_id, int) else (tuple(eos_id) if eos_id else None)
    B, K = len(prompts), options.num_beams
    ids, mask = left_pad(prompts, pad_id)
    prompt_len = ids.shape[1]
    max_new = min(max_new_tokens, context_length - prompt_len)  # transformers' max_length, inside the context
    ids, mask = np.repeat(ids, K, axis=0), np.repeat(mask, K, axis=0)  # (B*K, L): row b*K + k
    state = variant.start(B * K, prompt_len + max_new)
    logits = prefill(state, ids, mask, variant.prefill_chunk(B * K, prefill_chunk))
    fill = pad_id if pad_id is not None else (eos_id[0] if eos_id is not None else -1)
    beams = _Beams(np.full((B, K, max_new), fill, np.int64), np.where(np.arange(K) == 0, 0.0, NEG)[None].repeat(B, 0)
                   .astype(np.float32), np.full((B, K, max_new), fill, np.int64), np.full((B, K), NEG, np.float32),
                   np.zeros((B, K), np.int64), np.zeros((B, K), bool), np.ones((B, 1), bool))
    for t in range(max_new):  # t tokens generated so far
        source, hits_all = _step(beams, _log_softmax32(logits).reshape(B, K, -1), t, max_new, eos_id, options)
        if hits_all or not _unfinished(beams, options):
            break
        rows = (source + np.arange(B)[:, None] * K).reshape(-1)  # the cache row each new beam continues
        state.reorder(rows)
        mask = np.concatenate([mask, np.ones((B * K, 1), np.int64)], axis=1)
        pos = positions(mask)[:, -1:]
        logits = state.run(beams.running_seqs[:, :, t].reshape(-1, 1), mask, pos)
    return _results(beams, prompts, options.num_return_sequences)


def _step(beams: _Beams, logp: np.ndarray, t: int, max_new: int, eos_id: tuple[int, ...] | None,
          options: BeamOptions) -> tuple[np.ndarray, bool]:
    """One token for every beam: transformers' top-k continuations, running-beam selection and
    finished-beam update. logp (B, K, V). -> (source beam of each new running beam (B, K), all hit a stop)."""
    B, K, V = logp.shape
    keep = max(2, 1 + len(eos_id or ())) * K  # transformers' count: one more candidate per eos id
    acc = (logp + beams.running_scores[:, :, None]).reshape(B, K * V)
    top = _top(acc, keep)  # (B, keep)
    top_lp, src, tok = np.take_along_axis(acc, top, axis=1), top // V, top % V
    top_seqs = _gather(beams.running_seqs, src).copy()  # (B, keep, max_new)
    top_seqs[:, :, t] = tok
    hits = np.full(tok.shape, t + 1 >= max_new) | (np.isin(tok, eos_id) if eos_id is not None else False)
    # running: the K best continuations that did not just stop
    running_lp = top_lp + hits.astype(np.float32) * NEG
    nxt = _top(running_lp, K)
    beams.running_seqs, beams.running_scores = _gather(top_seqs, nxt), np.take_along_axis(running_lp, nxt, axis=1)
    # finished: the top-K candidates that just stopped compete with the hypotheses kept so far
    done_now = hits & (np.arange(keep) < K)[None]
    scores = top_lp / np.float32((t + 1) ** options.length_penalty)
    full = beams.finished.all(axis=1, keepdims=True) & (options.early_stopping is True)
    scores = scores + full * NEG + (~beams.improvable) * NEG + (~done_now) * NEG
    merged = np.concatenate([beams.scores, scores], axis=1)
    best = _top(merged, K)
    beams.seqs = _gather(np.concatenate([beams.seqs, top_seqs], axis=1), best)
    beams.scores = np.take_along_axis(merged, best, axis=1)
    beams.lengths = np.take_along_axis(np.concatenate([beams.lengths, np.full((B, keep), t + 1)], axis=1), best, axis=1)
    beams.finished = np.take_along_axis(np.concatenate([beams.finished, done_now], axis=1), best, axis=1)
    # can a running beam still beat the worst finished one?
    length = max_new if options.early_stopping == "never" and options.length_penalty > 0 else t + 1
    best_running = beams.running_scores[:, :1] / np.float32(length ** options.length_penalty)
    worst = np.where(beams.finished, beams.scores.min(axis=1, keepdims=True), NEG)
    beams.improvable &= (best_running > worst).any(axis=1, keepdims=True)
    return np.take_along_axis(src, nxt, axis=1), bool(hits.all())


def _unfinished(beams: _Beams, options: BeamOptions) -> bool:
    return bool(beams.improvable.any()) and not (bool(beams.finished.all()) and options.early_stopping is True)


def _results(beams: _Beams, prompts: Sequence[Sequence[int]], n: int) -> list[BeamResult]:
    out = []
    for b, prompt in enumerate(prompts):
        keep = [k for k in range(n) if beams.scores[b, k] > NEG / 2]  # a hypothesis that really finished
        out.append(BeamResult(list(prompt), [beams.seqs[b, k, :beams.lengths[b, k]].tolist() for k in keep],
                              [float(beams.scores[b, k]) for k in keep]))
    return out
