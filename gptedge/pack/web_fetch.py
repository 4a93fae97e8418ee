"""`gptedge fetch-web`: the playground's JavaScript for an install without a source checkout (a wheel).

The wheel ships the playground's package.json + package-lock.json, never the JavaScript. This fetches, once, the
npm tarballs the lock pins for the packages a browser runs (js_deps.PACKAGES: transformers.js, onnxruntime-web and
its onnxruntime-common), checks each against the lock's sha512 `integrity` before reading it, and keeps only what a
browser needs (js_deps.VENDOR_FILES / VENDOR_DIRS, about 15 MB) plus each package's package.json and licence files,
in the user cache:

    $GPTEDGE_CACHE (else $XDG_CACHE_HOME/gptedge, else ~/.cache/gptedge) / web / <key> / node_modules / ...

<key> names transformers.js' version and a digest of the three integrity strings, so a lock that pins other
tarballs gets another folder. The folder is built in a `.tmp-*` sibling and renamed into place whole: a failed or
interrupted fetch (bad integrity, a dropped connection, Ctrl-C) leaves nothing that js_deps would read.

URLs are npm's: REGISTRY/<name>/-/<basename>-<version>.tgz; REGISTRY is https://registry.npmjs.org unless
--registry / $GPTEDGE_NPM_REGISTRY names a mirror (the integrity check is the same either way).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
import shutil
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from gptedge.runtime.errors import GptEdgeError

from .js_deps import RECORD, VENDOR_DIRS, Pinned, cache_folder, missing_vendor_file, pinned_packages

log = logging.getLogger(__name__)

DEFAULT_REGISTRY = "https://registry.npmjs.org"
MAX_TARBALL = 256 * 2**20  # onnxruntime-web 1.31's tarball is the largest (33 MB); refuse a runaway response
STALE_TMP_S = 3600  # a `.tmp-*` older than this was left by a killed fetch: removed by the next one


class WebFetchError(GptEdgeError):
    """The playground's JavaScript could not be fetched (the network, a tarball that is not the pinned one)."""


def _download(pin: Pinned, registry: str, dest: Path) -> int:
    """The tarball into dest, its sha512 checked against the lock -> bytes; WebFetchError otherwise."""
    url = pin.url(registry)
    digest, size = hashlib.sha512(), 0
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(dest, "wb") as f:
            while chunk := response.read(1 << 20):
                size += len(chunk)
                if size > MAX_TARBALL:
                    raise WebFetchError(f"{url}: larger than {MAX_TARBALL >> 20} MB; not the pinned tarball")
                digest.update(chunk)
                f.write(chunk)
            expected = response.headers.get("Content-Length")
    except (urllib.error.URLError, OSError, ValueError) as e:  # HTTPError, timeouts, a dropped connection
        raise WebFetchError(f"could not download {url}: {getattr(e, 'reason', None) or e}") from None
    if expected and expected.isdigit() and size != int(expected):  # http.client ends a read(n) early silently
        raise WebFetchError(f"could not download {url}: the connection closed after {size} of {expected} bytes")
    got = "sha512-" + base64.b64encode(digest.digest()).decode()
    if got != pin.integrity:
        raise WebFetchError(f"{url}: integrity mismatch (got {got[:27]}..., the lock pins {pin.integrity[:27]}...); "
                            "nothing was kept")
    return size


def _extract(pin: Pinned, tarball: Path, node_modules: Path) -> int:
    """The wanted regular files of the tarball (npm's first path component stripped) -> count written."""
    written = 0
    with tarfile.open(tarball, "r:gz") as tar:
        for member in tar:
            parts = member.name.split("/", 1)
            if len(parts) < 2 or not member.isfile() or ".." in parts[1].split("/") or not pin.wanted(parts[1]):
                continue
            target = node_modules / pin.path / parts[1]
            target.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(member) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
            written += 1
    return written


def _remove_stale_tmp(root: Path) -> None:
    for old in root.glob(".tmp-*"):
        try:
            if time.time() - old.stat().st_mtime > STALE_TMP_S:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass


def fetch_web_deps(registry: str = DEFAULT_REGISTRY, lock_path: Path | None = None) -> dict:
    """Fetch the pinned packages into the user cache (once) -> {"node_modules", "fetched" (bool), "downloaded"
    (tarball bytes), "bytes" (kept), "versions"}."""
    if not re.match(r"^https?://", registry):
        raise WebFetchError(f"--registry {registry}: not an http(s) URL")
    pinned = pinned_packages(lock_path)
    folder = cache_folder(pinned)
    versions = {p.name: p.version for p in pinned}
    if (folder / RECORD).is_file() and missing_vendor_file(folder / "node_modules") is None:
        return {"node_modules": folder / "node_modules", "fetched": False, "downloaded": 0,
                "bytes": _size(folder / "node_modules"), "versions": versions}
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise WebFetchError(f"cannot create {folder.parent} ({e.strerror}): set GPTEDGE_CACHE to a writable "
                            "directory") from None
    _remove_stale_tmp(folder.parent)
    if folder.exists():  # a file deleted since it was fetched: fetched again, whole
        damaged = Path(tempfile.mkdtemp(prefix=".tmp-", dir=folder.parent)) / "damaged"
        os.rename(folder, damaged)
        shutil.rmtree(damaged.parent, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=folder.parent))
    try:
        downloaded = 0
        for pin in pinned:
            log.info("fetching %s", pin.url(registry))
            downloaded += _download(pin, registry, tmp / "package.tgz")
            _extract(pin, tmp / "package.tgz", tmp / "node_modules")
            (tmp / "package.tgz").unlink()
        missing = missing_vendor_file(tmp / "node_modules") or next(
            (d for d in VENDOR_DIRS if not (tmp / "node_modules" / d).is_dir()), None)
        if missing:
            raise WebFetchError(f"the pinned tarballs lack {missing}: not the packages the playground runs")
        record = {"registry": registry, "packages": [vars(p) for p in pinned]}
        (tmp / RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        try:
            os.rename(tmp, folder)
        except OSError:
            if not (folder / RECORD).is_file():  # not a concurrent fetch that finished first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already after the rename
    return {"node_modules": folder / "node_modules", "fetched": True, "downloaded": downloaded,
            "bytes": _size(folder / "node_modules"), "versions": versions}


def _size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
