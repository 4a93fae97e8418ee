"""The files of a model directory as its manifest records them: each one's path, size and SHA-256.

gptedge.json lists every file the runtime reads (the graph, the external data files the graph
names, tokenizer.json) with its size in bytes and SHA-256, recorded when export / quantize writes
the manifest (`record_files`). Paths are relative, '/'-separated, and confined to the directory:
an absolute path, a `..` part or a symlink leading out is refused (`confined`), so no manifest can
make another graph run under its name.

What load checks (docs/model-directory.md#model-directory-integrity): every size, always (a stat per
file), and every SHA-256, always, in a thread that runs while ONNX Runtime builds the session
(`HashCheck`): ONNX Runtime releases the GIL while it does, so the hashing costs little wall time
where the session takes longer to build than the files take to hash. Measured here (rough, busy
2-core Xeon, OpenSSL 3.0 with SHA-NI): about 1 GB/s, so GPT-2 small fp32 (0.5 GB) hashes in ~0.9 s
behind a ~2.2 s session build (+0.16 s wall), and GPT-2 XL fp32 (6.2 GB) in ~6 s of one core,
behind a session build of ~8 s. `gptedge verify DIR` hashes too, and checks everything else.

Digests are remembered per process for a file whose (device, inode, size, mtime, ctime) is unchanged,
so a command that loads the same dir twice (quantize's validation, compare) hashes it once.
"""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..errors import ModelDirError
from .onnx_wire import is_ort_format, read_graph_facts
from .tokenizer import TOKENIZER_FILE, has_tokenizer


@dataclass(frozen=True)
class FileRecord:
    path: str  # relative to the model dir, '/'-separated
    size: int  # bytes
    sha256: str  # hex


_digests: dict[tuple[int, ...], str] = {}
_digests_lock = threading.Lock()


def sha256_file(path: Path) -> str:
    st = os.stat(path)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    with _digests_lock:
        if key in _digests:
            return _digests[key]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)  # releases the GIL while it hashes a block
    digest = h.hexdigest()
    with _digests_lock:
        _digests[key] = digest
    return digest


def forget_digests() -> None:
    """Drop the remembered digests: the next load hashes every file again (benchmarks/load_integrity.py)."""
    with _digests_lock:
        _digests.clear()


def confined(model_dir: Path, name: str, what: str) -> Path:
    """model_dir / name, refused unless it is a relative path inside model_dir (symlinks followed)."""
    parts = PurePosixPath(name).parts
    if not name or PurePosixPath(name).is_absolute() or Path(name).is_absolute() or ".." in parts or "\\" in name:
        raise ModelDirError(f"{model_dir}: {what} {name!r} is not a plain path inside the model directory "
                            "(absolute, or with '..'): refused")
    path = model_dir / name
    root = model_dir.resolve()
    real = path.resolve()
    if real != root and root not in real.parents:
        raise ModelDirError(f"{model_dir}: {what} {name!r} leads outside the model directory (to {real}): refused")
    return path


def record_files(model_dir: str | Path, model_file: str) -> tuple[FileRecord, ...]:
    """The records of what the runtime reads in model_dir and is there: the graph, its external data,
    tokenizer.json (a manifest written without its graph records none for it: loading it fails anyway)."""
    model_dir = Path(model_dir)
    graph = confined(model_dir, model_file, "model_file")
    names = []
    if graph.is_file():
        names.append(model_file)
        base = PurePosixPath(model_file).parent
        if not is_ort_format(graph):  # an ORT-format graph holds its weights
            names += [str(base / loc) for loc in read_graph_facts(graph).external_files]
    if has_tokenizer(model_dir):
        names.append(TOKENIZER_FILE)
    records = []
    for name in dict.fromkeys(names):
        path = confined(model_dir, name, "file")
        records.append(FileRecord(name, path.stat().st_size, sha256_file(path)))
    return tuple(records)


def record_problems(model_dir: Path, records: tuple[FileRecord, ...]) -> list[str]:
    """Every recorded path confined, present and of its recorded size (a stat each) -> one line per problem, all
    of them (verify lists them; load raises the first through check_records)."""
    problems = []
    for r in records:
        try:
            path = confined(model_dir, r.path, "file")
        except ModelDirError as e:
            problems.append(str(e).removeprefix(f"{model_dir}: "))
            continue
        if not path.is_file():
            problems.append(f"{r.path} is missing (gptedge.json records {r.size:,} bytes)")
        elif (size := path.stat().st_size) != r.size:
            problems.append(f"{r.path} is {size:,} bytes, gptedge.json records {r.size:,} "
                            "(the file changed after gptedge wrote it)")
    return problems


def check_records(model_dir: Path, records: tuple[FileRecord, ...]) -> None:
    """record_problems, raising the first (load's pass before ONNX Runtime reads anything)."""
    problems = record_problems(model_dir, records)
    if problems:
        raise ModelDirError(f"{model_dir}: {problems[0]}")


def hash_problems(model_dir: Path, records: tuple[FileRecord, ...]) -> list[str]:
    """One line per recorded file whose SHA-256 is not the recorded one."""
    problems = []
    for r in records:
        try:
            digest = sha256_file(confined(model_dir, r.path, "file"))
        except OSError as e:
            problems.append(f"{r.path}: cannot read it ({e.strerror})")
            continue
        if digest != r.sha256:
            problems.append(f"{r.path}: its SHA-256 is {digest[:16]}..., gptedge.json records {r.sha256[:16]}... "
                            "(the file changed after gptedge wrote it)")
    return problems


class HashCheck:
    """hash_problems in a thread, started at once; `problems()` waits for it."""

    def __init__(self, model_dir: Path, records: tuple[FileRecord, ...]):
        self._result: list[str] = []
        self._thread = threading.Thread(target=self._run, args=(model_dir, records), name="gptedge-hash", daemon=True)
        self._thread.start()

    def _run(self, model_dir: Path, records: tuple[FileRecord, ...]) -> None:
        try:
            self._result = hash_problems(model_dir, records)
        except ModelDirError as e:  # checked before the thread started; a file may have moved since
            self._result = [str(e)]

    def problems(self) -> list[str]:
        self._thread.join()
        return self._result
