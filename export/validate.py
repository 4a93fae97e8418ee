"""Parity rungs 3-4 (docs/design.md#the-parity-ladder): an exported graph against the reference GPT.

Rung 3: prefill (empty past) and decode steps of a left-padded batch; logits and every
present.* within tolerance. Rung 4: greedy ids identical to the reference's, then text.
A failed comparison names the max diff, where it occurred and the top-1 agreement.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from gptedge.runtime import contract as C
from gptedge.runtime.errors import ParityError
from gptedge.runtime.generation.generation import positions
from gptedge.runtime.modeldir.manifest import GraphParity, GreedyParity

from .reference import GPT, greedy_ids

log = logging.getLogger(__name__)

GRAPH_TOLERANCE = 1e-4  # rung 3, fp32 on CPU
GREEDY_PROMPTS = ("It is a truth universally acknowledged", "In the beginning God created", "Hello world")


def _max_diff(a: np.ndarray, b: np.ndarray) -> tuple[float, tuple[int, ...]]:
    d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    idx = np.unravel_index(int(np.argmax(d)), d.shape) if d.size else ()
    return (float(d[idx]) if d.size else 0.0), tuple(int(i) for i in idx)


@dataclass(frozen=True)
class Step:
    """One run of rung 3: ids (B, S), attention mask (B, past + S), position ids (B, S)."""

    ids: np.ndarray
    mask: np.ndarray
    pos: np.ndarray


def graph_steps(cfg, batch: int = 2, prompt_len: int = 8, decode_steps: int = 3, seed: int = 0) -> list[Step]:
    """Rung 3's inputs on random ids: a prefill where row b is left-padded by b tokens, then decode steps."""
    rng = np.random.default_rng(seed)
    prompt_len = min(prompt_len, cfg.n_positions - decode_steps - 1)
    ids = rng.integers(0, cfg.vocab_size, size=(batch, prompt_len), dtype=np.int64)
    mask = np.ones((batch, prompt_len), dtype=np.int64)
    for b in range(batch):
        mask[b, : min(b, prompt_len - 1)] = 0
    steps = [Step(ids, mask, positions(mask))]
    for _ in range(decode_steps):
        ids = rng.integers(0, cfg.vocab_size, size=(batch, 1), dtype=np.int64)
        mask = np.concatenate([mask, np.ones((batch, 1), dtype=np.int64)], axis=1)
        steps.append(Step(ids, mask, mask.sum(axis=1, keepdims=True) - 1))
    return steps


Outputs = tuple[np.ndarray, list[np.ndarray]]  # logits (B, S, V), presents key0, value0, key1, ... (B, nh, T, hs)


@torch.no_grad()
def reference_outputs(reference: GPT, steps: Sequence[Step]) -> list[Outputs]:
    """The reference's logits and presents for each step, its own cache carried from step to step."""
    past, outs = None, []
    for st in steps:
        logits, presents = reference(torch.from_numpy(st.ids), torch.from_numpy(st.mask), torch.from_numpy(st.pos),
                                     past)
        outs.append((logits.numpy(), [t.numpy() for kv in presents for t in kv]))
        past = presents
    return outs


@dataclass
class _Worst:
    """The largest difference so far: where it is."""

    max_abs_diff: float = 0.0
    output: str = C.LOGITS
    step: str = "prefill"
    index: tuple[int, ...] = ()


def compare_graph_outputs(expected: Sequence[Outputs], loaded, steps: Sequence[Step],
                          tolerance: float = GRAPH_TOLERANCE) -> GraphParity:
    """Rung 3: the graph's outputs on `steps` against the reference's (reference_outputs) -> the figures,
    as the manifest records them."""
    batch = steps[0].ids.shape[0]
    past = loaded.empty_past(batch)
    worst = _Worst()
    agree = total = 0
    for step, (st, (ref_logits, ref_presents)) in enumerate(zip(steps, expected, strict=True)):
        logits, presents = loaded.forward(st.ids, st.mask, st.pos, past)
        where = "prefill" if step == 0 else f"decode {step}"
        # Positions of left padding are compared nowhere: no valid position ever attends to them, and
        # fused attention kernels are free to fill them differently.
        valid = st.mask[:, -st.ids.shape[1]:].astype(bool)  # (B, S) query positions
        valid_keys = st.mask.astype(bool)[:, None, :, None]  # (B, 1, T, 1) cache positions
        agree += int((ref_logits.argmax(-1) == logits.argmax(-1))[valid].sum())
        total += int(valid.sum())
        pairs = [(C.LOGITS, ref_logits, logits, valid[..., None])]
        for i in range(len(ref_presents) // 2):
            pairs += [(C.present_key(i), ref_presents[2 * i], presents[2 * i], valid_keys),
                      (C.present_value(i), ref_presents[2 * i + 1], presents[2 * i + 1], valid_keys)]
        for name, want, got, keep in pairs:
            if want.shape != got.shape:
                raise ParityError(f"{where}: {name} has shape {list(got.shape)}, the reference {list(want.shape)}")
            diff, idx = _max_diff(np.where(keep, want, 0), np.where(keep, got, 0))
            if diff > worst.max_abs_diff:
                worst = _Worst(diff, name, where, idx)
        past = presents
    figures = GraphParity(worst.max_abs_diff, worst.output, worst.step, worst.index, top1_agreement=agree / total,
                          tolerance=tolerance, batch=batch, prompt_tokens=steps[0].ids.shape[1],
                          decode_steps=len(steps) - 1)
    log.info("graph vs reference: max |diff| %.2e (%s, %s), top-1 %.4f", figures.max_abs_diff, figures.output,
             figures.step, figures.top1_agreement)
    if figures.max_abs_diff > tolerance:
        raise ParityError(f"graph vs reference: max |diff| {figures.max_abs_diff:.3e} > {tolerance:.0e} in "
                          f"{figures.output} at {figures.step} index {list(figures.index)}; "
                          f"top-1 agreement {figures.top1_agreement:.2%}")
    return figures


def compare_graph(reference: GPT, loaded, batch: int = 2, prompt_len: int = 8, decode_steps: int = 3,
                  seed: int = 0, tolerance: float = GRAPH_TOLERANCE) -> GraphParity:
    """Rung 3 on random ids; row b of the batch is left-padded by b tokens. Returns the figures."""
    steps = graph_steps(reference.cfg, batch, prompt_len, decode_steps, seed)
    return compare_graph_outputs(reference_outputs(reference.eval(), steps), loaded, steps, tolerance)


def reference_greedy(reference: GPT, prompts: Sequence[Sequence[int]], new_tokens: int = 64) -> list[list[int]]:
    """Rung 4's oracle: the reference's greedy continuation of each prompt."""
    return [greedy_ids(reference, list(p), new_tokens) for p in prompts]


def compare_greedy_ids(expected: Sequence[Sequence[int]], loaded, prompts: Sequence[Sequence[int]],
                       new_tokens: int = 64, tokenizer=None, note: str = "") -> GreedyParity:
    """Rung 4: greedy ids of the runtime equal the reference's (reference_greedy) for every prompt, then the text."""
    compared = 0
    for j, (prompt, want) in enumerate(zip(prompts, expected, strict=True)):
        want = list(want)
        got = loaded.generate(list(prompt), max_new_tokens=new_tokens, greedy=True).ids
        if want != got:
            k = next((i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), min(len(want), len(got)))
            raise ParityError(f"greedy ids differ from the reference at new token {k} of prompt {j} "
                              f"(reference {want[k:k + 1]}, graph {got[k:k + 1]}; {len(want)} vs {len(got)} tokens)")
        if tokenizer is not None and tokenizer.decode(want) != tokenizer.decode(got):
            raise ParityError(f"greedy text differs from the reference for prompt {j}")
        compared += len(want)
    figures = GreedyParity(prompts=len(prompts), tokens_compared=compared, new_tokens_per_prompt=new_tokens,
                           identical=True, note=note)
    log.info("greedy vs reference: %d prompts, %d tokens identical", len(prompts), compared)
    return figures


def compare_greedy(reference: GPT, loaded, prompts: Sequence[Sequence[int]], new_tokens: int = 64,
                   tokenizer=None) -> GreedyParity:
    """Rung 4: greedy ids of the runtime equal the reference's for every prompt, then the text."""
    return compare_greedy_ids(reference_greedy(reference, prompts, new_tokens), loaded, prompts, new_tokens, tokenizer)


def greedy_prompts(vocab_size: int, tokenizer=None, seed: int = 0) -> list[list[int]]:
    """Fixed text prompts through the tokenizer, or seeded random ids without one."""
    if tokenizer is not None:
        prompts = [tokenizer.encode(t, add_special_tokens=False).ids for t in GREEDY_PROMPTS]
        if all(p and max(p) < vocab_size for p in prompts):
            return prompts
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab_size, size=n).tolist() for n in (1, 5, 11)]
