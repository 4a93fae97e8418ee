"""A model dir's fingerprint: a short greedy run recorded at export / quantize, repeated by `gptedge verify`.

Eight seeded prompt ids, then eight greedy tokens; at each step the chosen token's logit and its
margin over the runner-up. The run needs nothing but the dir itself (no checkpoint, no fp32 source),
so `verify` can tell a dir that still computes what it computed when it was written from one that
does not (a kernel, a file or an ONNX Runtime that changed).

Repeating it: the ids must match step by step, except where the recorded margin is within the
tolerance (two tokens nearly tied: another CPU's kernels may pick the other one, and the runs part
there); each chosen logit must match within the tolerance. Tolerances, absolute + relative to the
logit: fp32 1e-3 (a CPU with other SIMD widths sums in another order: ~1e-5 seen), fp16 2e-2, quantized
0.1 + 1 % (kernels that quantize activations in-kernel move a logit by up to ~0.1 when a float
difference upstream flips one rounding).
"""

from __future__ import annotations

import numpy as np

from ..generation.generation import left_pad, prefill
from ..modeldir.manifest import Fingerprint

PROMPT_TOKENS = 8
NEW_TOKENS = 8
TOLERANCES = {"fp32": (1e-3, 1e-3), "fp16": (2e-2, 1e-2)}
QUANTIZED_TOLERANCE = (0.1, 1e-2)


def tolerance(precision: str, logit: float) -> float:
    absolute, relative = TOLERANCES.get(precision, QUANTIZED_TOLERANCE)
    return absolute + relative * abs(logit)


def record_fingerprint(model, seed: int = 0) -> Fingerprint:
    """The fingerprint of a LoadedModel, run on its own device."""
    shape = model.manifest.shape
    prompt_len = max(1, min(PROMPT_TOKENS, shape.context_length // 2))
    new = max(1, min(NEW_TOKENS, shape.context_length - prompt_len))
    prompt = np.random.default_rng(seed).integers(0, shape.vocab_size, prompt_len).tolist()
    ids, mask = left_pad([prompt], 0)
    state = model.variant.start(1, prompt_len + new)
    logits = prefill(state, ids, mask, chunk=None)[0].astype(np.float64)  # (V,)
    chosen, values, margins = [], [], []
    for step in range(new):
        best, runner_up = (int(i) for i in np.argsort(-logits, kind="stable")[:2])  # first of equals, as argmax
        chosen.append(best)
        values.append(float(logits[best]))
        margins.append(float(logits[best] - logits[runner_up]))
        if step + 1 == new:
            break
        mask = np.ones((1, prompt_len + step + 1), np.int64)
        logits = state.run(np.array([[best]], np.int64), mask, np.array([[prompt_len + step]], np.int64))[0]
        logits = logits.astype(np.float64)
    return Fingerprint(prompt_ids=tuple(prompt), ids=tuple(chosen), logits=tuple(values), margins=tuple(margins),
                       device=model.variant.kv_device)


def fingerprint_problems(recorded: Fingerprint, measured: Fingerprint, precision: str) -> list[str]:
    """One line per disagreement between the recorded run and this one (see the module docstring)."""
    if measured.prompt_ids != recorded.prompt_ids:
        return [f"parity: the fingerprint's prompt ids differ from the recorded ones "
                f"({list(measured.prompt_ids)[:4]}... vs {list(recorded.prompt_ids)[:4]}...)"]
    problems = []
    for step, (want, got, want_logit, got_logit, margin) in enumerate(
            zip(recorded.ids, measured.ids, recorded.logits, measured.logits, recorded.margins, strict=False)):
        tol = tolerance(precision, want_logit)
        if want != got:
            if margin > tol:
                problems.append(f"parity: greedy token {step + 1} is {got}, the manifest records {want} "
                                f"(recorded margin over the runner-up {margin:.4g}, tolerance {tol:.3g})")
            break  # a near tie may go either way; the runs part here
        if abs(got_logit - want_logit) > tol:
            problems.append(f"parity: logit of greedy token {step + 1} is {got_logit:.6g}, the manifest records "
                            f"{want_logit:.6g} (tolerance {tol:.3g})")
    return problems
