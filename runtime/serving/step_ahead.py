"""The next decode step launched before this one's tokens are emitted (the GPU's pool; docs/design.md#serving).

On a GPU the engine's turn was: run the step (~2.2 ms for 64 rows of GPT-2 small fp16 on an H100, the thread waiting
in ONNX Runtime), then emit each row's token on the host (select, detokenize, stop checks, the HTTP layer's
callback: ~20 us a row, ~1.3 ms for 64), then the next step. The GPU idled while the host emitted. When every
running row's token was picked on the device (plain greedy rows: DeviceSlotPool.step_picked), the next step's input
is known before any of this step's tokens is emitted: it is the picks themselves. So the engine hands that step to
this worker thread and emits meanwhile; ONNX Runtime releases the GIL while it runs, so the two overlap.

What the early step costs: a row that ends among the tokens being emitted was stepped once more for nothing (the
token is dropped, and its slot is freed only once the step is back: `remove` defers it). Nothing else may touch
the pool while a step is out, so the engine launches one only when nobody waits, no prompt is being prefilled in
chunks, no running row was cancelled, samples on the host, or lacks room for one more position, and it collects
the step before anything else happens on its thread.

The worker needs the GIL back twice a step (after the decode run, after the pick), while the engine thread and the
HTTP layer's event loop run Python: at CPython's default switch interval (5 ms) a thread can wait that long for it,
longer than the step. The interval is lowered to SWITCH_INTERVAL_S for the process from an engine's first step run
ahead until it closes: on
an H200 at 64 clients, 13,863 tok/s against 11,611 at 5 ms (benchmarks/results/gpu-2026-11-27-serve.md, round 4).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

log = logging.getLogger(__name__)

SWITCH_INTERVAL_S = 0.0002  # CPython's GIL hand-over interval (default 0.005): see above

# Handing a step to the worker and taking it back costs two thread wake-ups (~50-100 us), more than a few rows'
# emission saves: on an H200 (GPT-2 small fp16, benchmarks/results/gpu-2026-11-27-serve.md) stepping ahead at every
# batch size took one client from 893 to 797 tok/s and 8 clients from 4,027 to 3,675, while 64 clients went from
# 10,549 to 13,096. So only a batch of at least this many rows steps ahead.
MIN_ROWS = 16


class StepAhead:
    """The one step out at a time over a pool that picks greedy rows on the device (step_picked, room_to_step)."""

    def __init__(self, pool, min_rows: int = MIN_ROWS):
        self._pool, self.min_rows = pool, min_rows
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gptedge-step")
        self._out: tuple[list[int], Future] | None = None  # the seqs stepped, in order, and the step's future
        self._leaving: list[int] = []  # rows that ended while the step was out: their slots are freed after it
        self.launched = 0  # steps run ahead so far (a figure for tests and metrics)
        self._switch_before: float | None = None  # the process's GIL switch interval before the first launch

    @property
    def out(self) -> bool:
        """A step is running or done and not yet taken."""
        return self._out is not None

    def can_launch(self, rows: int) -> bool:
        """Whether a step of `rows` joined rows may go out now: none is out, the batch is big enough for the
        overlap to pay, and every row has room for one more position."""
        return self._out is None and rows >= self.min_rows and self._pool.room_to_step()

    def launch(self, seqs: Sequence[int], tokens: np.ndarray) -> None:
        """Step every joined sequence (seqs, each fed its token in tokens (n,) int64), greedy picks only."""
        if self._out is not None:
            raise RuntimeError("a step is already out")
        if self._switch_before is None and sys.getswitchinterval() > SWITCH_INTERVAL_S:
            self._switch_before = sys.getswitchinterval()
            log.info("stepping ahead: the GIL's switch interval %.4f s -> %.4f s", self._switch_before,
                     SWITCH_INTERVAL_S)
            sys.setswitchinterval(SWITCH_INTERVAL_S)
        seqs = list(seqs)
        self._out = (seqs, self._worker.submit(self._pool.step_picked, seqs, tokens, [False] * len(seqs)))
        self.launched += 1

    def take(self) -> dict[int, int]:
        """Wait for the step out -> each stepped seq's picked token; the slots of rows that left meanwhile freed
        (also when the step failed: its error is raised after)."""
        seqs, future = self._out
        self._out = None
        try:
            picked, _ = future.result()
        finally:
            self._free_leavers()
        return dict(zip(seqs, picked.tolist(), strict=True))

    def remove(self, seq: int) -> None:
        """Free a row's slot: now, or once the step out is back."""
        if self._out is None:
            self._pool.remove(seq)
        else:
            self._leaving.append(seq)

    def settle(self) -> None:
        """Wait for any step out, dropping its picks (and logging its error: the caller is failing or stopping
        anyway), and free the leavers' slots: the pool is the engine thread's alone again."""
        if self._out is not None:
            try:
                self.take()
            except Exception as e:  # already on the way out: the caller fails or cancels every row itself
                log.warning("a step run ahead failed: %s: %s", type(e).__name__, str(e).splitlines()[0][:200])
        self._free_leavers()

    def close(self) -> None:
        self.settle()
        self._worker.shutdown(wait=True)
        # unless someone changed it since (CPython keeps it in microseconds: 0.0002 reads back as 0.000199...)
        if self._switch_before is not None and abs(sys.getswitchinterval() - SWITCH_INTERVAL_S) < 1e-6:
            sys.setswitchinterval(self._switch_before)  # as it was

    def _free_leavers(self) -> None:
        leaving, self._leaving = self._leaving, []
        for seq in leaving:
            self._pool.remove(seq)
