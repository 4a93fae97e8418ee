"""The CPUs a test process may use. Under xdist each worker keeps to its share of them (tests/conftest.py); a test
about using every core (the browser's WASM threads follow navigator.hardwareConcurrency) starts its process with
all of them: a child inherits the affinity of the thread that starts it."""

from __future__ import annotations

import contextlib
import os

EVERY_CPU = "GPTEDGE_TEST_EVERY_CPU"  # set by the worker that narrowed its own: the CPUs it had before, "0,1"


@contextlib.contextmanager
def every_cpu():
    """Within the block, this thread (and any process it starts) may run on every CPU the worker had at start."""
    every = os.environ.get(EVERY_CPU)
    if not every or not hasattr(os, "sched_setaffinity"):
        yield
        return
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {int(c) for c in every.split(",")})
    try:
        yield
    finally:
        os.sched_setaffinity(0, mine)
