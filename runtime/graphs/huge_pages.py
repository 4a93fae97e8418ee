"""Back the weights and the KV cache of CPU sessions with transparent huge pages (Linux).

Batch-1 decode streams every weight once per token (a SmolLM2-135M-shaped 8-bit model: ~145 MB a step). On 4 KiB
pages that is ~37,000 TLB entries a step, and the prefetchers start cold at every page; on 2 MiB pages it is ~75.
Where the kernel's transparent huge pages are in `madvise` mode (Debian's and most distributions' default), memory
gets them only when asked, and ONNX Runtime never asks: its prepacked weights sit on 4 KiB pages. A decode step of
that model took 8.2-9.8 ms per process on 4 KiB pages and 6.5-7.0 ms on huge pages, side by side on a Zen 4
(benchmarks/results/huge-pages-2026-11-27.md); a day later the same host gave 0.97-1.03x: the TLB's cost
is the host's state as much as the guest's (benchmarks/results/llama-8bit-recheck-2026-11-28.md).

So after a CPU session is made, the memory it mapped (anonymous regions that were not there before) is collapsed
into huge pages (madvise MADV_COLLAPSE, Linux 6.1+; a copy, ~0.1-3 ms per 2 MiB as the kernel finds free blocks):
only 2 MiB pages whose every 4 KiB page is resident, so the process never grows (a new thread's stack or an arena's
unused tail stays as it is). A generation's KV cache is one numpy array, which numpy itself advises for huge pages
above 4 MB (kv_buffer_graph.KVBufferState; its pages are faulted in huge as steps write them, all of a
(layer, row, head) stripe at once). SessionConfig(huge_pages=False) keeps both on small pages. Where THP is off
("never"), "always" already gives large mappings huge pages, or the kernel has no MADV_COLLAPSE, nothing is done.
Memory the process mapped before (a peer's weights, another session's) is left alone. HUGE_PAGE is the PMD size of
x86-64 and of arm64 with 4 KiB pages.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import mmap
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
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
def libc():
    """The C library with madvise and mincore typed (file_pages.py uses it too)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.madvise.restype = ctypes.c_int
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    libc.mincore.restype = ctypes.c_int
    return libc


@functools.cache
def collapse_supported() -> bool:
    """Whether this kernel collapses memory on request (MADV_COLLAPSE, Linux 6.1+): tried once on a scratch
    mapping whose every byte is written, so a refusal means the kernel, not the memory."""
    if not advising():
        return False
    scratch = mmap.mmap(-1, 2 * HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # holds a whole 2 MiB page
    scratch.write(b"\x01" * len(scratch))
    view = ctypes.c_char.from_buffer(scratch)
    first, _ = _whole_pages(ctypes.addressof(view), ctypes.addressof(view) + len(scratch))
    del view  # released before close(), which refuses a mapping still exported
    supported = libc().madvise(first, HUGE_PAGE, MADV_COLLAPSE) == 0
    scratch.close()
    return supported


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


def resident_huge_pages(start: int, end: int) -> list[tuple[int, int]]:
    """The 2 MiB pages inside [start, end) whose every 4 KiB page is resident (mincore), merged into runs: only
    memory that is all there already is collapsed, so a collapse never makes the process bigger (a thread's stack,
    an arena's unused tail: a huge page over a few touched KB would make all 2 MiB resident)."""
    import numpy as np  # here: importing gptedge.runtime (and `gptedge --help`) stays free of numpy

    first, last = _whole_pages(start, end)
    if last - first < HUGE_PAGE:
        return []
    small = mmap.PAGESIZE
    flags = (ctypes.c_ubyte * ((last - first) // small))()
    if libc().mincore(first, last - first, flags) != 0:
        return []
    whole = (np.frombuffer(flags, np.uint8).reshape(-1, HUGE_PAGE // small) & 1).all(axis=1)  # (2 MiB pages,)
    runs: list[tuple[int, int]] = []
    for i in np.flatnonzero(whole).tolist():
        at = first + i * HUGE_PAGE
        if runs and runs[-1][1] == at:
            runs[-1] = (runs[-1][0], at + HUGE_PAGE)
        else:
            runs.append((at, at + HUGE_PAGE))
    return runs


def collapse(regions: list[tuple[int, int]]) -> int:
    """Collapse the wholly resident 2 MiB pages of each region into huge pages -> bytes collapsed. A range the
    kernel refuses (memory pinned, no free huge page) keeps its small pages; the rest go on."""
    if not collapse_supported():
        return 0
    done = 0
    for start, end in regions:
        for first, last in resident_huge_pages(start, end):
            if libc().madvise(first, last - first, MADV_COLLAPSE) == 0:
                done += last - first
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


@contextmanager
def numpy_small_pages() -> Iterator[None]:
    """numpy advises Linux for huge pages on arrays over 4 MB (madvise); inside, it does not. For arrays whose pages
    are touched sparsely (a cache row's window), where a huge page would make all 2 MiB resident."""
    try:
        from numpy._core.multiarray import _set_madvise_hugepage
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _set_madvise_hugepage
    previous = _set_madvise_hugepage(False)
    try:
        yield
    finally:
        _set_madvise_hugepage(previous)
