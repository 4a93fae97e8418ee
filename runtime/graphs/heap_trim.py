"""Give the C heap's free pages back to the system once a model is loaded (glibc's malloc_trim).

A load frees much of what it allocates: ONNX Runtime parses the graph (protobuf) and rewrites it, the dir's files are
hashed, the tokenizer's JSON is parsed. glibc keeps freed chunks resident (only the main heap's top is returned
by itself), so that memory stays in the process's RSS with nothing holding it: GPT-2 small at 8 bits, 27 MiB after
`load` (anonymous RSS 221 -> 194 MiB; the tokenizer alone leaves 14 of its 29). malloc_trim(0) returns every whole
free page of every arena to the kernel (the chunks stay free for malloc to reuse: a later allocation faults fresh
pages in, so the process's later peak can only be lower; after a few generations the difference is ~3 MiB, most of
the residue having been reused). ~0.3 ms a load. Elsewhere than glibc (musl, macOS) nothing is done; a failure is
logged, never raised.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import sys
import time

log = logging.getLogger(__name__)


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None where the C library has none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # musl has no malloc_trim
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def trim_heap() -> bool:
    """Return the heap's free pages to the kernel -> whether any were returned (False where there is no
    malloc_trim)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    started = time.perf_counter()
    try:
        released = bool(trim(0))
    except Exception as e:  # a trim is never a reason to fail a load
        log.info("malloc_trim failed: %s", e)
        return False
    log.debug("malloc_trim: %s in %.1f ms", "pages returned" if released else "nothing to return",
              (time.perf_counter() - started) * 1e3)
    return released
