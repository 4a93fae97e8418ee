"""A CPU session's weights on 2 MiB pages (runtime/graphs/huge_pages.py): memory mapped while a session is made is
collapsed into huge pages, memory mapped before is left alone, SessionConfig(huge_pages=False) and GPTEDGE_HUGE_PAGES=0
turn it off, and a generation's KV cache is one block numpy advises for huge pages."""

from __future__ import annotations

import ctypes
import mmap

import numpy as np
import pytest

from gptedge.runtime import SessionConfig, load
from gptedge.runtime.graphs import huge_pages

MIB = 1 << 20


def _huge_kib(address: int, size: int) -> int:
    """AnonHugePages (KiB) of this process's mappings that overlap [address, address + size)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5 and all(c in "0123456789abcdef-" for c in fields[0]):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                inside = start < address + size and end > address
            elif inside and fields[0] == "AnonHugePages:":
                total += int(fields[1])
    return total


def _private_mapping(size: int, touched: bool = True) -> tuple[mmap.mmap, int]:
    """A private anonymous mapping of `size` bytes (every byte written where `touched`) -> (the mmap, where its
    usable part starts). Its first and last 4 KiB page are made read-only, so the kernel never merges it with a
    neighbouring mapping and smaps reports it alone."""
    page = mmap.PAGESIZE
    memory = mmap.mmap(-1, size + 2 * page, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    view = ctypes.c_char.from_buffer(memory)
    base = ctypes.addressof(view)
    del view
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for guard in (base, base + page + size):
        assert libc.mprotect(guard, page, mmap.PROT_READ) == 0
    if touched:
        memory[page:page + size] = b"\x01" * size
    return memory, base + page


def _touched_private_mapping(size: int) -> tuple[mmap.mmap, int]:
    return _private_mapping(size)


needs_collapse = pytest.mark.skipif(not huge_pages.collapse_supported(),
                                    reason="this kernel gives huge pages without asking, or never (THP not madvise), "
                                           "or has no MADV_COLLAPSE (before Linux 6.1)")


def test_the_new_parts_of_regions_are_what_no_old_region_covered():
    before = {100: 200, 300: 400}
    after = {50: 250, 300: 450, 500: 600, 700: 800}
    assert huge_pages.new_parts(before, after) == [(50, 100), (200, 250), (400, 450), (500, 600), (700, 800)]
    assert huge_pages.new_parts(after, after) == []
    assert huge_pages.new_parts({100: 200, 300: 400}, {0: 500}) == [(0, 100), (200, 300), (400, 500)]  # two merged


@pytest.mark.parametrize(("text", "mode"), [("always [madvise] never\n", "madvise"),
                                           ("[always] madvise never", "always"), ("always madvise [never]", "never"),
                                           ("", "")])
def test_the_kernels_mode_is_read_from_its_brackets(tmp_path, monkeypatch, text, mode):
    path = tmp_path / "enabled"
    path.write_text(text)
    monkeypatch.setattr(huge_pages, "THP_ENABLED", path)
    huge_pages.thp_mode.cache_clear()
    try:
        assert huge_pages.thp_mode() == mode
    finally:
        huge_pages.thp_mode.cache_clear()


def test_no_kernel_file_means_no_mode(tmp_path, monkeypatch):
    monkeypatch.setattr(huge_pages, "THP_ENABLED", tmp_path / "absent")
    huge_pages.thp_mode.cache_clear()
    try:
        assert huge_pages.thp_mode() == "" and not huge_pages.advising()
    finally:
        huge_pages.thp_mode.cache_clear()


@needs_collapse
def test_memory_mapped_while_a_session_is_made_lands_on_huge_pages_and_older_memory_does_not():
    older, older_at = _touched_private_mapping(8 * MIB)
    with huge_pages.weights_on_huge_pages(True):
        newer, newer_at = _touched_private_mapping(8 * MIB)
    assert _huge_kib(newer_at, 8 * MIB) >= 4096  # at least two of the (at most) four whole 2 MiB pages inside
    assert _huge_kib(older_at, 8 * MIB) == 0
    page = mmap.PAGESIZE
    assert newer[page:page + 4] == b"\x01" * 4 and newer[-page - 1:-page] == b"\x01"  # a copy: nothing lost
    older.close()
    newer.close()


@needs_collapse
def test_turned_off_nothing_is_collapsed():
    with huge_pages.weights_on_huge_pages(False):
        memory, at = _touched_private_mapping(8 * MIB)
    assert _huge_kib(at, 8 * MIB) == 0
    memory.close()


def test_the_environment_turns_it_off_for_every_command(monkeypatch):
    monkeypatch.setenv("GPTEDGE_HUGE_PAGES", "0")
    assert SessionConfig().huge_pages is False
    monkeypatch.setenv("GPTEDGE_HUGE_PAGES", "1")
    assert SessionConfig().huge_pages is True
    assert SessionConfig(huge_pages=False).huge_pages is False


@needs_collapse
def test_only_wholly_resident_huge_pages_are_collapsed_so_the_process_never_grows():
    memory, at = _private_mapping(8 * MIB, touched=False)
    start = at - mmap.PAGESIZE  # where the mmap's own bytes begin (its first page is the guard)
    first = -(-at // (2 * MIB)) * 2 * MIB  # the first whole 2 MiB page inside
    memory[first - start:first - start + 2 * MIB] = b"\x01" * (2 * MIB)  # that one written in full
    memory[first - start + 2 * MIB] = 1  # the next: one 4 KiB page of 512
    assert huge_pages.resident_huge_pages(at, at + 8 * MIB) == [(first, first + 2 * MIB)]
    assert huge_pages.collapse([(at, at + 8 * MIB)]) == 2 * MIB
    assert _huge_kib(at, 8 * MIB) == 2048
    memory.close()


@pytest.mark.parametrize("on", [True, False])
def test_a_cpu_load_collapses_its_sessions_new_memory_only_when_asked(gpt2_kv_buffer_loaded, monkeypatch, on):
    seen = []
    monkeypatch.setattr(huge_pages, "advising", lambda: True)
    monkeypatch.setattr(huge_pages, "collapse", lambda regions: seen.append(regions) or 0)
    model = load(gpt2_kv_buffer_loaded.model_dir, device="cpu", session=SessionConfig(threads=1, huge_pages=on))
    assert len(seen) == (1 if on else 0)
    assert model.variant.huge_pages is on  # the generation's KV block follows the same choice


def test_a_generations_kv_cache_is_one_block_written_in_place(gpt2_kv_buffer_loaded):
    model = load(gpt2_kv_buffer_loaded.model_dir, device="cpu", session=SessionConfig(threads=1))
    state = model.variant.start(2, 12)
    block = state._block  # (2 x n_layer, B, kv_heads, max_len, width)
    assert block.shape[:2] == (2 * model.manifest.shape.n_layer, 2)
    assert [b.data_ptr() for b in state.buffers] == [block[i].ctypes.data for i in range(len(block))]
    assert block.ctypes.data % 64 == 0
    block[...] = np.nan
    prompt = np.array([[5, 6, 7], [8, 9, 10]], np.int64)
    state.run_argmax(prompt, np.ones((2, 3), np.int64), np.tile(np.arange(3), (2, 1)))
    assert np.isfinite(block[:, :, :, :3]).all()  # the run wrote its keys and values into the block itself
    assert np.isnan(block[:, :, :, 3:]).all()
