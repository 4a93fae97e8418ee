"""Write a whole output directory atomically: build it beside its final name, then rename into place.

An interrupted or failed command leaves no half-written directory; an existing output is
replaced only when asked to, and only once the new one is complete.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from gptedge.runtime.errors import OutputExistsError


def check_output(out: Path, force: bool) -> None:
    if out.exists() and not force:
        raise OutputExistsError(f"{out} exists; pass --force to replace it")
    if out.exists() and not out.is_dir():
        raise OutputExistsError(f"{out} exists and is not a directory")


@contextlib.contextmanager
def atomic_output_dir(out: str | Path, force: bool = False) -> Iterator[Path]:
    """Yields an empty temporary directory next to `out`; on success it becomes `out`."""
    out = Path(out)
    check_output(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it 0700; the output should look like any new directory
    try:
        yield tmp
        check_output(out, force)  # it may have appeared while we worked
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            out.replace(old / out.name)
            tmp.replace(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.replace(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
