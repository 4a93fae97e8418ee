"""Give back the model data file's pages that ONNX Runtime leaves mapped after a session is made (Linux).

ONNX Runtime maps each external initializer of `model.onnx.data` (a private, writable file mapping per tensor),
prepacks what its kernels prepack into memory of its own, and unmaps those originals; the ones a kernel reads in
place stay mapped, with every page that the load touched still resident and counted in the process's RSS. For GPT-2
small at 8 bits that is ~52 MiB of 136: the tied 8-bit embedding's 41 MB with its scales (which MatMulNBits has
packed again for the LM head, while the embedding's Gather reads one 768-byte row a token), the 3 MB position table,
and the pages the kernel mapped around them (benchmarks/results/genai-and-one-client-2026-11-27.md).

So after a CPU session is made, the mappings of the model directory's files (the kernel's resolved paths: a data
file that is a symlink, as in a Hub cache snapshot, counts by its target) that hold no private copy of a page
(smaps' Anonymous and Swap 0: a write to a private mapping copies the page into anonymous memory, which may be
swapped out, and only those copies hold bytes the file does not; the file's own pages, dirty in the page cache after
a fresh export or not, are the file's) are dropped from the process with madvise(MADV_DONTNEED). Nothing is lost: a
page read later faults back in from the page cache (or the file), as llama.cpp's mmapped GGUF does, with its
neighbours (the kernel's fault-around: 64 KB, or a large folio): under a long run of varied tokens most of an
embedding table comes back, at most the mapping's size. A mapping with a private copy is left alone, as is every
mapping of a file elsewhere (libraries, a peer's files). It is a trim, never a reason to fail a load: an error is
logged and the load goes on. Elsewhere than Linux nothing is done. Cost: reading smaps and the madvise calls, ~20-35 ms
a session for GPT-2 small or the SmolLM2-135M shape (320-390 mappings; a load takes 0.7-1 s); ~1 ms where the model
maps no file of its dir (weights inside model.onnx: /proc/self/maps says so first).
"""

from __future__ import annotations

import logging
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from .huge_pages import MAPS, libc  # MAPS: the same mappings as smaps without sizes, ~20x cheaper to read

log = logging.getLogger(__name__)

SMAPS = Path("/proc/self/smaps")
MADV_DONTNEED = 4
_HEADER = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \S+\s*(.*)$")


@dataclass
class FileMapping:
    start: int
    end: int
    perms: str
    path: str
    fields: dict[str, int]  # smaps' sizes in kB: Rss, Anonymous, ...

    @property
    def clean(self) -> bool:
        """No page of it was written privately, resident or swapped out: every page is the file's own (a mapping whose
        smaps lacks either line is not known clean)."""
        return self.fields.get("Anonymous", 1) == 0 and self.fields.get("Swap", 1) == 0


def file_mappings(smaps_text: str | None = None) -> list[FileMapping]:
    """This process's file-backed mappings with their smaps sizes; [] where /proc has none."""
    if smaps_text is None:
        try:  # a file name need not be UTF-8: its bytes are kept as surrogates, never matched by mistake
            smaps_text = SMAPS.read_bytes().decode("utf-8", "surrogateescape")
        except OSError:
            return []
    mappings: list[FileMapping] = []
    current: FileMapping | None = None
    for line in smaps_text.splitlines():
        header = _HEADER.match(line)
        if header:
            start, end, perms, path = header.groups()
            current = FileMapping(int(start, 16), int(end, 16), perms, path.strip(), {})
            if current.path.startswith("/"):
                mappings.append(current)
            continue
        if current is not None:
            name, _, rest = line.partition(":")
            value = rest.split()
            if value and value[0].isdigit():
                current.fields[name] = int(value[0])
    return mappings


def _model_files(directory: str) -> tuple[str, set[str]]:
    """-> (the directory's resolved path, the resolved paths of the files in it): smaps names a file by its resolved
    path, so a symlinked data file is matched by its target."""
    root = os.path.realpath(directory)
    try:
        with os.scandir(directory) as entries:
            targets = {os.path.realpath(e.path) for e in entries}
    except OSError:
        targets = set()
    return root, targets


def release_clean_pages(directory: str | os.PathLike, mappings: list[FileMapping] | None = None) -> int:
    """Drop the resident pages of every clean mapping of a file in `directory` -> bytes that were resident.
    A mapping with a privately written page, or one the kernel refuses, keeps its pages."""
    if not sys.platform.startswith("linux"):
        return 0
    root, targets = _model_files(os.fspath(directory))

    def ours(path: str) -> bool:
        return path in targets or path.startswith(root + os.sep)

    if mappings is None:
        if not _maps_any(ours):  # a model with its weights inside model.onnx maps no file: smaps' cost is spared
            return 0
        mappings = file_mappings()
    released = 0
    for m in mappings:
        if ours(m.path) and m.clean and m.fields.get("Rss", 0):
            if libc().madvise(m.start, m.end - m.start, MADV_DONTNEED) == 0:
                released += m.fields["Rss"] * 1024
    return released


def _maps_any(ours) -> bool:
    """Whether this process maps any file `ours` accepts (/proc/self/maps; True where it cannot be read)."""
    try:
        text = MAPS.read_bytes().decode("utf-8", "surrogateescape")
    except OSError:
        return True
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and ours(fields[5].strip()):
            return True
    return False


def release_model_file_pages(model_dir: str | os.PathLike | None) -> None:
    """After a CPU session of the model in `model_dir` is made: its files' clean pages leave the process. A trim:
    whatever goes wrong is logged, never raised."""
    if model_dir is None or not sys.platform.startswith("linux"):
        return
    try:
        released = release_clean_pages(model_dir)
    except Exception as e:  # /proc unreadable in a sandbox, a libc without madvise: the load goes on
        log.debug("model data file pages not given back: %s: %s", type(e).__name__, e)
        return
    if released:
        log.info("model data file: %.0f MiB of mapped pages given back after the session was made", released / 2**20)
