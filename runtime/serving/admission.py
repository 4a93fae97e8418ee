"""The engine's admission policy as a pure function: which newcomers prefill this loop turn, and how.

The engine (engine.py) asks `plan_prefill` once per turn and carries the plan out; the policy itself needs no
model, no session and no thread, so it is tested on plain numbers (tests/serve/test_admission.py), as vLLM's scheduler
returns its decisions as data.

The policy: a running row waits at most one prefill run between two tokens, and a run takes at most `budget`
prompt positions, padding counted. So newcomers leave the queue's head in order while rows are free and k
prompts padded to the longest fit (k x longest <= budget), and are prefilled together in one run; a prompt
longer than the budget on its own is admitted alone and prefilled one chunk per turn, and while its chunks
run nobody else is admitted. No budget (None): every newcomer that has a row, in one run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class PrefillPlan:
    """One turn's prefill. admit: newcomers to take off the queue's head now; chunked: this turn runs one chunk of
    a long prompt (the one admitted now, or the one already in progress when admit is 0). Neither: no prefill."""

    admit: int = 0
    chunked: bool = False
    reused: tuple[int, ...] = ()  # per admitted newcomer, positions taken from the prefix cache; () when none


def _length_and_reused(item: int | tuple[int, int]) -> tuple[int, int]:
    return (item, 0) if isinstance(item, int) else (int(item[0]), int(item[1]))


NOTHING = PrefillPlan()
NEXT_CHUNK = PrefillPlan(0, chunked=True)


def plan_prefill(in_progress: bool, waiting: Iterable[int | tuple[int, int]], running: int, max_batch: int,
                 budget: int | None) -> PrefillPlan:
    """-> this turn's plan. in_progress: a long prompt's chunks are under way; waiting: the prompt lengths of
    the queue from its head, each an int or (length, positions reused from the prefix cache), read lazily (only
    as many as can be admitted); running: rows decoding now."""
    if in_progress:
        return NEXT_CHUNK
    admit, longest, reused = 0, 0, []
    items = iter(waiting)
    while running + admit < max_batch and (item := next(items, None)) is not None:
        length, cached = _length_and_reused(item)
        padded = max(longest, length - cached)  # the positions it runs
        if admit and budget is not None and padded * (admit + 1) > budget:
            break
        admit, longest = admit + 1, padded
        reused.append(cached)
    if not admit:
        return NOTHING
    return PrefillPlan(admit, chunked=admit == 1 and budget is not None and longest > budget,
                       reused=tuple(reused) if any(reused) else ())


# Holding newcomers back (a pool whose runs are launch-bound: the GPU's). An uncaptured prefill run costs about a
# decode step whatever its size (GPT-2 small fp16 on an H100: ~3 ms for 1 to 8 prompts), so newcomers trickling in
# one a step, as a busy server's are, cost one run each: at 64 clients of 128-token requests, one run every other
# step. A newcomer may wait while rows run, until HOLD_GROUP newcomers wait, or as many as there are free rows, or
# the head of the queue has waited hold_s: the runs are fewer and fuller, first tokens come at most hold_s later.
# Off by default (`serve --prefill-hold-ms`): the load serve_load.py sends (every client's requests in lockstep)
# arrives in groups already, and on it 0 / 10 / 25 ms gave 12,462 / 12,334 / 13,312 tok/s at 64 clients on an H200
# (benchmarks/results/gpu-2026-11-27-serve.md), within that load's run-to-run spread.
HOLD_GROUP = 8  # 8 prompts of 32 tokens filled the old GPU default budget (256 positions); 2048 takes 64: unmeasured


def holds_newcomers(waiting: int, oldest_waited_s: float, running: int, max_batch: int, hold_s: float) -> bool:
    """Whether this turn's newcomers (waiting of them, the head queued oldest_waited_s ago) wait for company."""
    if not hold_s or not waiting or not running:
        return False  # nothing held with nothing running: an idle engine prefills at once
    return waiting < min(max_batch - running, HOLD_GROUP) and oldest_waited_s < hold_s
