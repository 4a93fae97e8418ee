"""Back the weights and the KV cache of CPU sessions with transparent huge pages (Linux).

Batch-1 decode streams every weight once per token (a SmolLM2-135M-shaped 8-bit model: ~145 MB a step). On 4 KiB
pages that is ~37,000 TLB entries a step, and the prefetchers start cold at every page; on 2 MiB pages it is ~75.
Where the kernel's transparent huge pages are in `madvise` mode (Debian's and most distributions' default), memory
gets them only when asked, and ONNX Runtime never asks: its prepacked weights sit on 4 KiB pages. A decode step of
that model took 8.2-9.8 ms per process on 4 KiB pages and 6.5-7.0 ms on huge pages, side by side on a Zen 4
(benchmarks/results/huge-pages-2026-11-27.md).

So after a CPU session is made, the anonymous memory it mapped is collapsed into huge pages (madvise MADV_COLLAPSE,
Linux 6.1+; a copy, ~1-2 ms per 2 MiB). The KV cache of a generation is one numpy array, which numpy itself
advises for huge pages above 4 MB (kv_buffer_graph.KVBufferState). Where the kernel lacks MADV_COLLAPSE, or THP is
off ("never"), or "always" already gives every large mapping huge pages, nothing is done. Memory the process mapped
before (a peer's weights, another session's) is left alone.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
MAPS = Path("/proc/self/maps")


@functools.cache
def thp_mode() -> str:
    """The kernel's transparent huge page mode: "always", "madvise", "never", or "" where there is none."""
    try:
        text = THP_ENABLED.read_text()
    except OSError:
        return ""
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else ""


def advising() -> bool:
    """Whether asking for huge pages changes anything here: Linux with THP in madvise mode."""
    return sys.platform.startswith("linux") and thp_mode() == "madvise"


@functools.cache
def _madvise():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.madvise.restype = ctypes.c_int
    return libc.madvise


def anonymous_regions() -> dict[int, int]:
    """Writable anonymous mappings of this process (the malloc heap included): start -> end."""
    regions = {}
    try:
        lines = MAPS.read_text().splitlines()
    except OSError:
        return regions
    for line in lines:
        fields = line.split()
        if len(fields) < 5 or not fields[1].startswith("rw"):
            continue
        if len(fields) > 5 and fields[5] != "[heap]":  # files, stacks, vdso
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        regions[start] = end
    return regions


def _whole_pages(start: int, end: int) -> tuple[int, int]:
    """-> the 2 MiB-aligned part of [start, end) (empty where there is none)."""
    first = -(-start // HUGE_PAGE) * HUGE_PAGE
    return first, max(first, end // HUGE_PAGE * HUGE_PAGE)


def new_parts(before: dict[int, int], after: dict[int, int]) -> list[tuple[int, int]]:
    """The parts of `after`'s regions that no region of `before` covered (a mapping that grew, in either direction,
    gives its new part only)."""
    old = sorted(before.items())
    parts = []
    for start, end in sorted(after.items()):
        for old_start, old_end in old:
            if old_end <= start or old_start >= end:
                continue
            if old_start > start:
                parts.append((start, old_start))
            start = max(start, old_end)
        if start < end:
            parts.append((start, end))
    return parts


def collapse(regions: list[tuple[int, int]]) -> int:
    """Advise and collapse each region's aligned part into huge pages -> bytes collapsed. A kernel that refuses
    (no MADV_COLLAPSE before 6.1, no memory to spare) leaves the pages as they are."""
    madvise, done = _madvise(), 0
    for start, end in regions:
        first, last = _whole_pages(start, end)
        if last - first < HUGE_PAGE:
            continue
        madvise(first, last - first, MADV_HUGEPAGE)
        if madvise(first, last - first, MADV_COLLAPSE) == 0:
            done += last - first
        elif ctypes.get_errno() == 22:  # EINVAL: this kernel has no MADV_COLLAPSE; the rest would fail alike
            break
    return done


@contextmanager
def weights_on_huge_pages(enabled: bool = True) -> Iterator[None]:
    """Around the making of a CPU session: on the way out, the anonymous memory mapped meanwhile (new regions, and
    the grown end of old ones) is collapsed into huge pages."""
    if not (enabled and advising()):
        yield
        return
    before = anonymous_regions()
    yield
    started = time.perf_counter()
    done = collapse(new_parts(before, anonymous_regions()))
    log.info("weights on huge pages: %.0f MiB collapsed in %.2f s", done / 2**20, time.perf_counter() - started)
