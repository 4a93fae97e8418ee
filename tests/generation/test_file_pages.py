"""The model data file's pages ONNX Runtime leaves mapped leave the process once a session is made
(runtime/graphs/file_pages.py): only clean mappings of files in the model's directory, their bytes intact when read
again; a mapping with a written page, or a file elsewhere, keeps its pages; SessionConfig(release_file_pages=False)
keeps them all."""

from __future__ import annotations

import gc
import mmap
import os
import sys

import numpy as np
import pytest

from gptedge import onnx_files
from gptedge.runtime import SessionConfig, load
from gptedge.runtime.graphs import file_pages
from gptedge.runtime.graphs.session import make_session

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps and madvise: Linux")
PAGES = 64


def _rss_kib(path) -> int:
    """Resident KiB of this process's mappings of `path`."""
    real = os.path.realpath(path)
    return sum(m.fields.get("Rss", 0) for m in file_pages.file_mappings() if os.path.realpath(m.path) == real)


def _mapped_file(directory, name: str, write_one_page: bool = False) -> tuple[mmap.mmap, bytes]:
    """A file of PAGES pages of seeded bytes, mapped private and writable as ONNX Runtime maps initializers, every
    page read (resident) and, where asked, one page written -> (the mapping, the file's bytes)."""
    data = np.random.default_rng(7).integers(0, 256, PAGES * mmap.PAGESIZE, dtype=np.uint8).tobytes()
    path = directory / name
    path.write_bytes(data)
    with open(path, "r+b") as f:
        memory = mmap.mmap(f.fileno(), len(data), flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    assert memory[:] == data  # every page read: resident
    if write_one_page:
        memory[5 * mmap.PAGESIZE] = (data[5 * mmap.PAGESIZE] + 1) % 256
    return memory, data


def test_smaps_text_gives_file_mappings_with_their_sizes():
    text = """7f0000000000-7f0000004000 rw-p 00000000 08:01 123 /models/m/model.onnx.data
Size:                 16 kB
Rss:                   8 kB
Private_Dirty:         8 kB
Anonymous:             0 kB
Swap:                  0 kB
VmFlags: rd wr mr mw me ac
7f0000004000-7f0000008000 rw-p 00000000 00:00 0
Rss:                   4 kB
7f0000008000-7f000000c000 rw-p 00001000 08:01 124 /models/my model/model.onnx.data
Rss:                   4 kB
Private_Dirty:         4 kB
Anonymous:             4 kB
Swap:                  0 kB
7f000000c000-7f0000010000 r--p 00002000 08:01 124 /models/m/model.onnx.data
Rss:                   4 kB
7f0000010000-7f0000014000 rw-p 00003000 08:01 124 /models/m/model.onnx.data
Rss:                   0 kB
Anonymous:             0 kB
Swap:                  4 kB
"""
    first, second, third, fourth = file_pages.file_mappings(text)  # the anonymous mapping is not a file's
    assert (first.start, first.end, first.perms, first.path) == (0x7F0000000000, 0x7F0000004000, "rw-p",
                                                                 "/models/m/model.onnx.data")
    assert first.fields["Rss"] == 8 and first.clean  # dirty in the page cache (a fresh file), no private copy
    assert second.path == "/models/my model/model.onnx.data" and not second.clean  # a page written through it
    assert not third.clean  # no Anonymous line: not known clean
    assert not fourth.clean  # its written page is swapped out, not resident: still not the file's bytes


@linux_only
def test_a_clean_mapping_in_the_directory_is_released_and_reads_back_the_same(tmp_path):
    memory, data = _mapped_file(tmp_path, "model.onnx.data")
    assert _rss_kib(tmp_path / "model.onnx.data") >= PAGES * mmap.PAGESIZE // 1024
    assert file_pages.release_clean_pages(tmp_path) >= PAGES * mmap.PAGESIZE
    assert _rss_kib(tmp_path / "model.onnx.data") == 0
    assert memory[:] == data  # faulted back in from the file
    memory.close()


@linux_only
def test_a_mapping_with_a_written_page_keeps_every_page(tmp_path):
    memory, data = _mapped_file(tmp_path, "model.onnx.data", write_one_page=True)
    before = _rss_kib(tmp_path / "model.onnx.data")
    assert file_pages.release_clean_pages(tmp_path) == 0
    assert _rss_kib(tmp_path / "model.onnx.data") == before
    assert memory[5 * mmap.PAGESIZE] == (data[5 * mmap.PAGESIZE] + 1) % 256  # the written byte survives
    memory.close()


@linux_only
def test_files_outside_the_directory_are_left_alone(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model-other").mkdir()  # shares the directory's name as a prefix
    memory, _ = _mapped_file(tmp_path / "model-other", "weights.bin")
    before = _rss_kib(tmp_path / "model-other" / "weights.bin")
    assert file_pages.release_clean_pages(tmp_path / "model") == 0
    assert _rss_kib(tmp_path / "model-other" / "weights.bin") == before > 0
    memory.close()


@linux_only
def test_a_symlinked_data_file_is_released_by_its_target(tmp_path):
    """As in a Hub cache snapshot: the model dir holds a link, the bytes live elsewhere (smaps names the target)."""
    (tmp_path / "blobs").mkdir()
    (tmp_path / "model").mkdir()
    memory, data = _mapped_file(tmp_path / "blobs", "abc123")
    (tmp_path / "model" / "model.onnx.data").symlink_to(tmp_path / "blobs" / "abc123")
    assert file_pages.release_clean_pages(tmp_path / "model") >= PAGES * mmap.PAGESIZE
    assert _rss_kib(tmp_path / "blobs" / "abc123") == 0
    assert memory[:] == data
    memory.close()


def test_a_failure_to_give_pages_back_never_fails_a_load(tmp_path, monkeypatch):
    def unreadable():
        raise PermissionError("/proc/self/smaps")
    monkeypatch.setattr(file_pages, "file_mappings", unreadable)
    file_pages.release_model_file_pages(tmp_path)  # logged, not raised


@pytest.fixture(scope="module")
def external_data_dir(tmp_path_factory, gpt2_checkpoint):
    """A tiny GPT-2 exported with its weights in model.onnx.data (the threshold lowered as for a big model)."""
    from gptedge.export.exporter import export_checkpoint

    out = tmp_path_factory.mktemp("external") / "md"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(onnx_files, "EXTERNAL_DATA_THRESHOLD", 1000)
        export_checkpoint(gpt2_checkpoint, out)
    assert (out / "model.onnx.data").exists()
    return out


@linux_only
def test_a_session_gives_back_its_data_files_pages_only_when_asked(external_data_dir):
    graph, data = str(external_data_dir / "model.onnx"), external_data_dir / "model.onnx.data"
    kept = make_session(graph, "cpu", SessionConfig(threads=1, release_file_pages=False))
    assert _rss_kib(data) > 0  # the tied embedding, read in place by its Gather
    del kept
    gc.collect()  # that session, and with it its mappings of the file, gone
    session = make_session(external_data_dir / "model.onnx", "cpu", SessionConfig(threads=1))  # a Path too
    assert _rss_kib(data) == 0
    del session


@linux_only
def test_a_model_whose_pages_were_given_back_generates_the_same_tokens(external_data_dir):
    prompt = [5, 6, 7, 8]
    kept = load(external_data_dir, device="cpu", session=SessionConfig(threads=1, release_file_pages=False))
    expected = kept.generate(prompt, 12, greedy=True, ignore_eos=True).ids
    model = load(external_data_dir, device="cpu", session=SessionConfig(threads=1))
    assert model.generate(prompt, 12, greedy=True, ignore_eos=True).ids == expected
