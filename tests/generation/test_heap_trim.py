"""The C heap's free pages leave the process once a model is loaded (runtime/graphs/heap_trim.py): malloc_trim gives
back what was freed and keeps what is held; load() and load_classifier() trim unless SessionConfig(trim_heap=False)."""

from __future__ import annotations

import ctypes
import sys

import pytest

import gptedge.runtime.classify as classify_module
import gptedge.runtime.model as model_module
from gptedge.runtime import SessionConfig, load, load_classifier
from gptedge.runtime.graphs import heap_trim

glibc_only = pytest.mark.skipif(not sys.platform.startswith("linux") or heap_trim._malloc_trim() is None,
                                reason="malloc_trim: glibc on Linux")
CHUNK = 64 << 10  # under glibc's mmap threshold (128 KiB at first): served from the heap, kept there when freed
CHUNKS = 1024  # 64 MiB


def _rss_anon_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:"))


@glibc_only
def test_the_trim_gives_back_freed_heap_pages_and_keeps_held_ones():
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    chunks = [libc.malloc(CHUNK) for _ in range(CHUNKS)]
    assert all(chunks)
    for c in chunks:
        ctypes.memset(c, 1, CHUNK)  # resident
    pinned = libc.malloc(CHUNK)  # above them: freeing the rest leaves a hole malloc keeps, not a top it returns
    held = chunks[::8]  # one in eight stays allocated, with its bytes
    for i, c in enumerate(chunks):
        if i % 8:
            libc.free(c)
    before = _rss_anon_kib()
    assert heap_trim.trim_heap()
    after = _rss_anon_kib()
    freed_kib = CHUNKS * 7 // 8 * CHUNK >> 10
    assert before - after > freed_kib // 2, (before, after)
    assert all(ctypes.string_at(c, CHUNK) == b"\x01" * CHUNK for c in held)
    for c in held + [pinned]:
        libc.free(c)


def test_no_malloc_trim_means_nothing_is_done(monkeypatch):
    monkeypatch.setattr(heap_trim, "_malloc_trim", lambda: None)
    assert heap_trim.trim_heap() is False


def test_a_failing_trim_is_logged_not_raised(monkeypatch):
    def broken(_pad):
        raise OSError("no")

    monkeypatch.setattr(heap_trim, "_malloc_trim", lambda: broken)
    assert heap_trim.trim_heap() is False


@pytest.mark.parametrize("trim", [True, False])
def test_load_trims_the_heap_only_when_asked(monkeypatch, gpt2_model_dir, task_dirs, trim):
    calls = []
    monkeypatch.setattr(model_module, "trim_heap", lambda: calls.append("lm"))
    monkeypatch.setattr(classify_module, "trim_heap", lambda: calls.append("classifier"))
    config = SessionConfig(threads=1, trim_heap=trim)
    lm = load(gpt2_model_dir, device="cpu", session=config)
    load_classifier(next(iter(task_dirs.values())), device="cpu", session=config)
    assert calls == (["lm", "classifier"] if trim else [])
    assert lm.generate([5, 6, 7], 4, greedy=True, ignore_eos=True).ids  # a trimmed load still generates
