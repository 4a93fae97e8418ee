"""Write a whole output directory atomically: build it beside its final name, then rename into place.

An interrupted or failed command leaves no half-written directory; an existing output is
replaced only when asked to, and only once the new one is complete.

What `--force` may replace (decided before any work, in `check_output`): OUT must be a dir that
gptedge wrote (its gptedge.json parses as a gptedge manifest, or, for a `gptedge pack` output, its
gptedge-pack.json as a pack manifest: a file of that name alone is not enough) or an empty dir. It is
never the source or the input model, nor a folder holding one of them, nor the working directory or a
parent of it.

No output of any command is one of its inputs or lies inside one (`refuse_inputs`): not a model dir
written inside the checkpoint it comes from, not a table written over the text it was measured on or
into the model dir it describes. Both are refused before any work.

The partial dir `.OUT.partial-*` is made beside OUT and carries a marker file naming the
process that writes it. A run that dies without cleaning up (SIGKILL, power loss) leaves it
behind; the next run that writes the same OUT removes every marked partial dir whose process
is gone (and finishes an interrupted replacement: see `sweep_stale`). Every temporary file a
command needs belongs inside the partial dir. Stale dirs are found by their exact names (the literal prefix
`.OUT.partial-` or `.OUT.old-`, then a suffix without a dot), never by a glob built from OUT's name, which may
hold `*` or `[`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from gptedge.runtime.errors import ModelDirError, OutputExistsError, OutputNotWritableError
from gptedge.runtime.modeldir.manifest import MANIFEST_NAME, read_manifest

MARKER = ".gptedge-partial"  # inside a partial or old dir: {"pid": ..., "host": ...}
PACK_MANIFEST = "gptedge-pack.json"  # what `gptedge pack` writes in place of a model dir's manifest
# what follows `.OUT.partial-` / `.OUT.old-`: tempfile's random characters, never a dot (a dot would make it
# another output's leftover: `.a.old-b.partial-x` belongs to OUT `a.old-b`, not to `a`)
_TEMP_SUFFIX = re.compile(r"[^.]+")


def writable_dir_for(path: Path) -> Path:
    """The nearest existing ancestor of `path` (the dir a new `path` would be made in), if it is a
    writable directory; else OutputNotWritableError naming it. Missing dirs between are made later."""
    path = Path(os.path.abspath(path))
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise OutputNotWritableError(f"cannot write {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputNotWritableError(f"cannot write {path}: {parent} is not writable")
    try:  # file modes do not stop root, a read-only mount or /proc does: try it
        fd, probe = tempfile.mkstemp(prefix=".gptedge-probe-", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise OutputNotWritableError(f"cannot write {path}: {parent}: {e.strerror}") from None
    return parent


def _contains(folder: Path, path: Path) -> bool:
    return folder == path or folder in path.parents


def refuse_inputs(out: str | Path, inputs: Iterable[str | Path | None]) -> None:
    """Refuse an output that is one of the inputs or lies inside one (symlinks followed). Inputs that do
    not exist (a Hub id) are skipped."""
    real = Path(os.path.abspath(out)).resolve()
    for source in inputs:
        if source is None or not (Path(source).exists() or Path(source).is_symlink()):
            continue
        src = Path(source).resolve()
        if real == src:
            raise OutputExistsError(f"{out} is the input {source}, which this command reads; choose another output")
        if src.is_dir() and src in real.parents:
            raise OutputExistsError(f"{out} lies inside the input {source}, which this command reads; "
                                    "choose an output outside it")


def _is_gptedge_dir(out: Path) -> bool:
    """Its gptedge.json parses as a gptedge manifest, or (a `gptedge pack` output) its gptedge-pack.json is a
    pack manifest: a JSON object naming its format and target."""
    if (out / MANIFEST_NAME).is_file():
        try:
            read_manifest(out)
        except ModelDirError:
            return False
        return True
    try:
        pack = json.loads((out / PACK_MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(pack, dict) and {"format", "target"} <= set(pack)


def check_output(out: str | Path, force: bool, inputs: Iterable[str | Path] = ()) -> None:
    """Refuse, before any work, an OUT that may not be written or replaced (see the module docstring).
    `inputs`: what the command reads (the source checkpoint, the input model, a calibration text)."""
    out = Path(out)
    inputs = tuple(i for i in inputs if i is not None)
    refuse_inputs(out, inputs)
    if out.exists() or out.is_symlink():
        if not force:
            raise OutputExistsError(f"{out} exists; pass --force to replace it")
        if not out.is_dir():
            raise OutputExistsError(f"{out} exists and is not a directory; refusing to replace it")
        real = out.resolve()
        for source in inputs:
            if _contains(real, Path(source).resolve()):
                what = "is" if real == Path(source).resolve() else "holds"
                raise OutputExistsError(f"{out} {what} the input {source}, which this command reads; "
                                        "refusing to replace it (choose another output)")
        cwd = Path.cwd().resolve()
        if _contains(real, cwd):
            what = "is" if real == cwd else "holds"
            raise OutputExistsError(f"{out} {what} the current directory; refusing to replace it")
        marked = [n for n in (MANIFEST_NAME, PACK_MANIFEST) if (out / n).is_file()]
        if marked:
            if not _is_gptedge_dir(out):
                raise OutputExistsError(f"{out / marked[0]} is not a gptedge manifest, so gptedge did not write "
                                        f"{out}; refusing to replace it")
        elif any(out.iterdir()):
            raise OutputExistsError(f"{out} is not empty and gptedge did not write it (no {MANIFEST_NAME}); "
                                    "refusing to replace it")
        if not os.access(out, os.W_OK | os.X_OK):  # it is renamed aside, then removed
            raise OutputNotWritableError(f"cannot replace {out}: it is not writable")
    writable_dir_for(out)


def _mark(folder: Path) -> None:
    """The owner marker, written whole or not at all (a reader never sees it half-written)."""
    part = folder / f"{MARKER}.tmp"
    part.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
    part.replace(folder / MARKER)


def _alive(marker: Path) -> bool:
    """Whether the process that wrote `marker` may still be running (unreadable: assume it is)."""
    try:
        owner = json.loads(marker.read_text())
        pid, host = int(owner["pid"]), str(owner["host"])
    except (OSError, ValueError, KeyError, TypeError):
        return True
    if host != socket.gethostname():
        return True  # another machine on a shared disk: not ours to judge
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def sweep_stale(out: Path) -> list[Path]:
    """Remove the marked partial / old dirs of OUT whose process is gone; -> what was removed.

    A run killed between renaming the old OUT aside and renaming the new one in left OUT missing
    and the old one in `.OUT.old-*/OUT`: it is put back first."""
    removed = []
    if not out.parent.is_dir():
        return removed
    names = sorted(p.name for p in out.parent.iterdir())
    for kind in ("old", "partial"):
        prefix = f".{out.name}.{kind}-"
        ours = [n for n in names if n.startswith(prefix) and _TEMP_SUFFIX.fullmatch(n[len(prefix):])]
        for stale in [out.parent / n for n in ours]:
            if not (stale / MARKER).is_file() or _alive(stale / MARKER):
                continue
            kept = stale / out.name
            if kind == "old" and kept.is_dir() and not (out.exists() or out.is_symlink()):
                kept.replace(out)
            shutil.rmtree(stale, ignore_errors=True)
            removed.append(stale)
    return removed


@contextlib.contextmanager
def atomic_output_dir(out: str | Path, force: bool = False, inputs: Iterable[str | Path] = ()) -> Iterator[Path]:
    """Yields an empty temporary directory next to `out`; on success it becomes `out`."""
    out = Path(out)
    inputs = tuple(inputs)
    check_output(out, force, inputs)
    sweep_stale(out)
    made = [p for p in reversed(Path(os.path.abspath(out)).parents) if not p.exists()]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = None
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
        _mark(tmp)
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it 0700; the output should look like any new directory
        yield tmp
        check_output(out, force, inputs)  # it may have appeared while we worked
        (tmp / MARKER).unlink()
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            _mark(old)
            out.replace(old / out.name)
            tmp.replace(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.replace(out)
    finally:
        if tmp is not None and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if not out.exists():  # failed: the folders made for it go too
            for folder in reversed(made):
                with contextlib.suppress(OSError):
                    folder.rmdir()


def check_output_file(path: str | Path, inputs: Iterable[str | Path | None] = ()) -> None:
    """A file output (a table, a chart): refused before any work when it cannot be written, or when it is
    one of `inputs` or lies inside one. An existing file is replaced (once the new one is complete), a
    folder never."""
    path = Path(path)
    refuse_inputs(path, inputs)
    if path.is_dir():
        raise OutputExistsError(f"{path} is a directory; name a file")
    writable_dir_for(path)


@contextlib.contextmanager
def atomic_output_file(path: str | Path, inputs: Iterable[str | Path | None] = ()) -> Iterator[Path]:
    """Yields a temporary path beside `path` (same suffix, hidden); on success it becomes `path`."""
    path = Path(path)
    check_output_file(path, inputs)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.stem}.partial-", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())
        tmp.replace(path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


@contextlib.contextmanager
def scratch_dir(out: str | Path) -> Iterator[Path]:
    """A marked partial dir beside OUT for intermediate files (export --precision fp16's fp32 graph): removed
    on exit, and by the next run's sweep_stale if this process is killed."""
    out = Path(out)
    made = [p for p in reversed(Path(os.path.abspath(out)).parents) if not p.exists()]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        _mark(tmp)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if not out.exists():  # failed: the folders made for it go too, as atomic_output_dir does
            for folder in reversed(made):
                with contextlib.suppress(OSError):
                    folder.rmdir()
