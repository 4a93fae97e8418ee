"""Parity rungs 3-4 (DESIGN §4): an exported graph against the reference GPT.

Rung 3: prefill (empty past) and decode steps of a left-padded batch; logits and every
present.* within tolerance. Rung 4: greedy ids identical to the reference's, then text.
A failed comparison names the max diff, where it occurred and the top-1 agreement.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import torch

from gptedge.runtime import contract as C
from gptedge.runtime.errors import ParityError
from gptedge.runtime.generation import positions

from .reference import GPT, greedy_ids

log = logging.getLogger(__name__)

GRAPH_TOLERANCE = 1e-4  # rung 3, fp32 on CPU
GREEDY_PROMPTS = ("It is a truth universally acknowledged", "In the beginning God created", "Hello world")


def _max_diff(a: np.ndarray, b: np.ndarray) -> tuple[float, tuple[int, ...]]:
    d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    idx = np.unravel_index(int(np.argmax(d)), d.shape) if d.size else ()
    return (float(d[idx]) if d.size else 0.0), tuple(int(i) for i in idx)


@torch.no_grad()
def compare_graph(reference: GPT, loaded, batch: int = 2, prompt_len: int = 8, decode_steps: int = 3,
                  seed: int = 0, tolerance: float = GRAPH_TOLERANCE) -> dict:
    """Rung 3 on random ids; row b of the batch is left-padded by b tokens. Returns the figures."""
    cfg = reference.cfg
    rng = np.random.default_rng(seed)
    prompt_len = min(prompt_len, cfg.n_positions - decode_steps - 1)
    ids = rng.integers(0, cfg.vocab_size, size=(batch, prompt_len), dtype=np.int64)
    mask = np.ones((batch, prompt_len), dtype=np.int64)
    for b in range(batch):
        mask[b, : min(b, prompt_len - 1)] = 0
    pos = positions(mask)
    past_ref, past_onnx = None, loaded.empty_past(batch)
    worst = {"max_abs_diff": 0.0, "output": C.LOGITS, "step": "prefill", "index": []}
    agree = total = 0
    for step in range(decode_steps + 1):
        ref_logits, ref_presents = reference(torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(pos), past_ref)
        logits, presents = loaded.forward(ids, mask, pos, past_onnx)
        where = "prefill" if step == 0 else f"decode {step}"
        # Positions of left padding are compared nowhere: no valid position ever attends to them, and
        # fused attention kernels are free to fill them differently.
        valid = mask[:, -ids.shape[1]:].astype(bool)  # (B, S) query positions
        valid_keys = mask.astype(bool)[:, None, :, None]  # (B, 1, T, 1) cache positions
        agree += int((ref_logits.numpy().argmax(-1) == logits.argmax(-1))[valid].sum())
        total += int(valid.sum())
        pairs = [(C.LOGITS, ref_logits.numpy(), logits, valid[..., None])]
        for i, (k, v) in enumerate(ref_presents):
            pairs += [(C.present_key(i), k.numpy(), presents[2 * i], valid_keys),
                      (C.present_value(i), v.numpy(), presents[2 * i + 1], valid_keys)]
        for name, want, got, keep in pairs:
            if want.shape != got.shape:
                raise ParityError(f"{where}: {name} has shape {list(got.shape)}, the reference {list(want.shape)}")
            diff, idx = _max_diff(np.where(keep, want, 0), np.where(keep, got, 0))
            if diff > worst["max_abs_diff"]:
                worst = {"max_abs_diff": diff, "output": name, "step": where, "index": list(idx)}
        past_ref, past_onnx = ref_presents, presents
        ids = rng.integers(0, cfg.vocab_size, size=(batch, 1), dtype=np.int64)
        mask = np.concatenate([mask, np.ones((batch, 1), dtype=np.int64)], axis=1)
        pos = mask.sum(axis=1, keepdims=True) - 1
    figures = {**worst, "top1_agreement": agree / total, "tolerance": tolerance, "batch": batch,
               "prompt_tokens": prompt_len, "decode_steps": decode_steps}
    log.info("graph vs reference: max |diff| %.2e (%s, %s), top-1 %.4f", worst["max_abs_diff"], worst["output"],
             worst["step"], figures["top1_agreement"])
    if worst["max_abs_diff"] > tolerance:
        raise ParityError(f"graph vs reference: max |diff| {worst['max_abs_diff']:.3e} > {tolerance:.0e} in "
                          f"{worst['output']} at {worst['step']} index {worst['index']}; "
                          f"top-1 agreement {figures['top1_agreement']:.2%}")
    return figures


def compare_greedy(reference: GPT, loaded, prompts: Sequence[Sequence[int]], new_tokens: int = 64,
                   tokenizer=None) -> dict:
    """Rung 4: greedy ids of the runtime equal the reference's for every prompt, then the text."""
    compared = 0
    for j, prompt in enumerate(prompts):
        want = greedy_ids(reference, list(prompt), new_tokens)
        got = loaded.generate(list(prompt), max_new_tokens=new_tokens, greedy=True).ids
        if want != got:
            k = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
            raise ParityError(f"greedy ids differ from the reference at new token {k} of prompt {j} "
                              f"(reference {want[k:k + 1]}, graph {got[k:k + 1]}; {len(want)} vs {len(got)} tokens)")
        if tokenizer is not None and tokenizer.decode(want) != tokenizer.decode(got):
            raise ParityError(f"greedy text differs from the reference for prompt {j}")
        compared += len(want)
    figures = {"prompts": len(prompts), "tokens_compared": compared, "new_tokens_per_prompt": new_tokens,
               "identical": True}
    log.info("greedy vs reference: %d prompts, %d tokens identical", len(prompts), compared)
    return figures


def greedy_prompts(vocab_size: int, tokenizer=None, seed: int = 0) -> list[list[int]]:
    """Fixed text prompts through the tokenizer, or seeded random ids without one."""
    if tokenizer is not None:
        prompts = [tokenizer.encode(t, add_special_tokens=False).ids for t in GREEDY_PROMPTS]
        if all(p and max(p) < vocab_size for p in prompts):
            return prompts
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab_size, size=n).tolist() for n in (1, 5, 11)]
