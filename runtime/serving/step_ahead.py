"""Decode steps run ahead of their tokens' emission, as a chain on a worker thread (the GPU's pool;
docs/design.md#serving).

On a GPU the engine's turn was: run the step (~2.2 ms for 64 rows of GPT-2 small fp16 on an H100, the thread waiting
in ONNX Runtime), then emit each row's token on the host (select, detokenize, stop checks, the HTTP layer's
callback: ~20 us a row, ~1.3 ms for 64), then the next step. The GPU idled while the host emitted. When every
running row's token was picked on the device (plain greedy rows: DeviceSlotPool.step_picked), the next step's input
is known before any of this step's tokens is emitted: it is the picks themselves. So the engine starts a chain on
this worker thread: each step fed the last one's picks, at most CHAIN_DEPTH steps done and not yet taken, while the
engine takes them in order and emits; ONNX Runtime releases the GIL while a step runs, so the two overlap.

What running ahead costs: a row that ends among the tokens being emitted was stepped once or twice more for nothing
(its tokens are dropped). Nothing else may touch the pool while a chain runs, so the engine starts one only when
nobody waits, no prompt is being prefilled in chunks, no running row was cancelled, samples on the host, or lacks
room for one more position; a row that leaves (`remove`: its slot freed as the chain ends), a cancel or a newcomer
due stops the chain after the step it runs, and the engine takes the steps it did before anything else happens on
its thread.

The worker needs the GIL back after each decode run and pick, while the engine thread and the
HTTP layer's event loop run Python: at CPython's default switch interval (5 ms) a thread can wait that long for it,
longer than the step. The interval is lowered to SWITCH_INTERVAL_S for the process from an engine's first step run
ahead until it closes: on
an H200 at 64 clients, 13,863 tok/s against 11,611 at 5 ms (benchmarks/results/gpu-2026-11-27-serve.md, round 4).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

log = logging.getLogger(__name__)

SWITCH_INTERVAL_S = 0.0002  # CPython's GIL hand-over interval (default 0.005): see above

# Handing a step to the worker and taking it back costs two thread wake-ups (~50-100 us), more than a few rows'
# emission saves: on an H200 (GPT-2 small fp16, benchmarks/results/gpu-2026-11-27-serve.md) stepping ahead at every
# batch size took one client from 893 to 797 tok/s and 8 clients from 4,027 to 3,675, while 64 clients went from
# 10,549 to 13,096. So only a batch of at least this many rows steps ahead.
MIN_ROWS = 16

# Steps a chain may run ahead of the engine's emission. With 1 each next step waited for the engine thread to take
# the last one and hand it over (the worker's wake-up and the engine's, each a GIL hand-over under a busy event loop:
# ~0.3-0.6 ms a step on an H200 host, against a 2 ms step); with 2 the worker launches the next step from the picks
# it just read, and the engine emits one step behind.
CHAIN_DEPTH = 2


class StepAhead:
    """Steps run ahead over a pool that picks greedy rows on the device (step_picked, room_to_step): a chain of them
    on one worker thread, each fed the last one's picks, until the engine stops it (see CHAIN_DEPTH)."""

    def __init__(self, pool, min_rows: int = MIN_ROWS, depth: int | None = None):
        self._pool, self.min_rows = pool, min_rows
        self.depth = CHAIN_DEPTH if depth is None else depth  # steps done and not yet taken, at most
        if self.depth < 1:  # 0 would leave the worker waiting for a step the engine can never take
            raise ValueError(f"depth must be >= 1, got {self.depth}")
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gptedge-step")
        self._cv = threading.Condition()
        self._done: deque[tuple[list[int], np.ndarray | None, BaseException | None]] = deque()  # steps not taken
        self._active = False  # the chain runs on the worker (it touches the pool)
        self._stop = False  # the chain ends after the step it is running
        self._leaving: list[int] = []  # rows that ended while the chain ran: their slots are freed after it
        self._chains = 0  # chains launched: the number of the one running (or last run)
        self.launched = 0  # steps run ahead so far (a figure for tests and metrics)
        self._switch_before: float | None = None  # the process's GIL switch interval before the first launch

    @property
    def out(self) -> bool:
        """A chain runs, or steps of it are done and not yet taken."""
        with self._cv:
            return self._active or bool(self._done)

    def can_launch(self, rows: int) -> bool:
        """Whether steps of `rows` joined rows may run ahead now: the batch is big enough for the overlap to pay,
        and every row has room for one more position (a running chain checks that itself before each step)."""
        if rows < self.min_rows:
            return False
        with self._cv:
            if self._active or self._done:
                return self._active and not self._stop
        return self._pool.room_to_step()

    def launch(self, seqs: Sequence[int], tokens: np.ndarray) -> None:
        """Step every joined sequence (seqs, each fed its token in tokens (n,) int64), greedy picks only, then on
        from each step's picks; a chain still running goes on by itself (these tokens are its last picks)."""
        with self._cv:
            if self._active or self._done:  # a chain runs on, or ended on its own (no room, a failed step) since
                return  # can_launch: its steps are taken first, and the next launch starts from the last of them
            self._active, self._stop = True, False
            self._chains += 1
            chain = self._chains
        if self._switch_before is None and sys.getswitchinterval() > SWITCH_INTERVAL_S:
            self._switch_before = sys.getswitchinterval()
            log.info("stepping ahead: the GIL's switch interval %.4f s -> %.4f s", self._switch_before,
                     SWITCH_INTERVAL_S)
            sys.setswitchinterval(SWITCH_INTERVAL_S)
        try:
            self._worker.submit(self._chain, chain, list(seqs), np.asarray(tokens, np.int64))
        except BaseException:  # the executor is shut down: no chain runs, nobody may wait for one
            with self._cv:
                self._active = False
                self._cv.notify_all()
            raise

    def _chain(self, chain: int, seqs: list[int], tokens: np.ndarray) -> None:  # on the worker
        try:
            self._steps(seqs, tokens)
        finally:  # an error outside a step (room_to_step, a leaver's remove): nobody may wait for the chain after
            with self._cv:
                # this chain's: once it ended, the engine may already have launched the next one
                if self._active and self._chains == chain:
                    self._active = False
                    self._cv.notify_all()

    def _steps(self, seqs: list[int], tokens: np.ndarray) -> None:
        needs = [False] * len(seqs)
        while True:
            try:
                picked, _ = self._pool.step_picked(seqs, tokens, needs)
                done, failed = (seqs, picked, None), False
            except BaseException as e:  # the engine raises it when it takes this step
                done, failed = (seqs, None, e), True
            with self._cv:
                self._done.append(done)
                self.launched += 1
                self._cv.notify_all()
                while not self._stop and not failed and len(self._done) >= self.depth:
                    self._cv.wait()  # the engine is behind: wait for it to take one
                if self._stop or failed or not self._pool.room_to_step():
                    # still this chain's pool, and in the same hold of the lock as the end: a row the engine lets go
                    # after this sees no chain running and frees its slot itself
                    self._free_leavers_now()
                    self._active = False
                    self._cv.notify_all()
                    return
            tokens = picked

    def take(self) -> dict[int, int] | None:
        """Wait for the oldest step not taken -> each stepped seq's picked token (its error raised instead, once the
        chain has ended), or None when the chain ended with no step left to take (stopped while it waited for the
        engine); the slots of rows that left are freed as soon as no chain runs."""
        with self._cv:
            while not self._done and self._active:
                self._cv.wait()
            step = self._done.popleft() if self._done else None  # None: the chain ended in its wait for the engine
            self._cv.notify_all()  # a chain waiting for room in self._done goes on
            if step is not None and step[2] is not None:  # a failed step ends its chain: let it end
                self._stop = True
                while self._active:
                    self._cv.wait()
        self._free_leavers()
        if step is None:
            return None
        seqs, picked, error = step
        if error is not None:
            raise error
        return dict(zip(seqs, picked.tolist(), strict=True))

    def stop(self) -> None:
        """End the chain after the step it is running (its steps done are still taken, in order)."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()

    def remove(self, seq: int) -> None:
        """Free a row's slot: now, or once no chain runs (which then ends after its current step)."""
        with self._cv:
            if self._active:
                self._leaving.append(seq)
                self._stop = True
                self._cv.notify_all()
                return
        self._pool.remove(seq)

    def settle(self) -> None:
        """End any chain, dropping the picks not taken (and logging a step's error: the caller is failing or
        stopping anyway), and free the leavers' slots: the pool is the engine thread's alone again."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
            while self._active:
                self._cv.wait()
            errors = [e for _, _, e in self._done if e is not None]
            self._done.clear()
        for e in errors[:1]:
            log.warning("a step run ahead failed: %s: %s", type(e).__name__, str(e).splitlines()[0][:200])
        self._free_leavers()

    def close(self) -> None:
        self.settle()
        self._worker.shutdown(wait=True)
        # unless someone changed it since (CPython keeps it in microseconds: 0.0002 reads back as 0.000199...)
        if self._switch_before is not None and abs(sys.getswitchinterval() - SWITCH_INTERVAL_S) < 1e-6:
            sys.setswitchinterval(self._switch_before)  # as it was

    def _free_leavers(self) -> None:
        with self._cv:
            if not self._active:
                self._free_leavers_now()

    def _free_leavers_now(self) -> None:  # holding self._cv, no step running
        leaving, self._leaving = self._leaving, []
        for seq in leaving:
            self._pool.remove(seq)
