"""The playground page and the JavaScript it runs: where they are, and which files of them a browser needs.

The page (index.html + playground.js) ships in the package, in gptedge/playground/. Its JavaScript comes from npm
into a folder the project controls: gptedge/playground/node_modules, installed by `npm ci --ignore-scripts` from the
committed package.json + package-lock.json (scripts/setup.sh does it; versions pinned by the lock, nothing fetched
from a CDN or at page load). `$GPTEDGE_WEB_MODULES` names another node_modules holding the same packages. An
install without a source checkout (a wheel: it ships the page, package.json and the lock, never the JavaScript)
runs `gptedge fetch-web` once: web_fetch.py downloads the tarballs the lock pins, checks their integrity and keeps
what a browser needs in the user cache, where node_modules() finds it last.

A browser needs only VENDOR_FILES from it (about 15 MB, most of it onnxruntime-web's WASM binary): `gptedge serve`
serves them under /vendor/ and `gptedge pack --target web` copies them into the packed folder's playground/vendor/.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from gptedge.runtime.errors import GptEdgeError
from gptedge.sample import cache_dir

PLAYGROUND_DIR = Path(__file__).resolve().parents[1] / "playground"
PAGE_FILES = ("index.html", "playground.js")
# onnxruntime-web's own copy of onnxruntime-common (the lock nests it: the top-level one is onnxruntime-node's older
# release), so the Tensor class transformers.js builds feeds is the one the WASM backend was built with.
ORT_COMMON = "onnxruntime-web/node_modules/onnxruntime-common"
# Relative to node_modules. transformers.js' web build imports 'onnxruntime-web/webgpu' and 'onnxruntime-common';
# index.html's import map sends the first to the WASM-only bundle, whose one binary is ort-wasm-simd-threaded.wasm.
VENDOR_FILES = (
    "@huggingface/transformers/dist/transformers.web.min.js",
    "@huggingface/transformers/package.json",
    "@huggingface/transformers/LICENSE",
    "onnxruntime-web/dist/ort.wasm.bundle.min.mjs",
    "onnxruntime-web/dist/ort-wasm-simd-threaded.mjs",
    "onnxruntime-web/dist/ort-wasm-simd-threaded.wasm",
    "onnxruntime-web/package.json",
    "onnxruntime-web/README.md",
    f"{ORT_COMMON}/package.json",
)
VENDOR_DIRS = (f"{ORT_COMMON}/dist/esm",)  # ES modules importing one another: the whole folder
PACKAGES = ("@huggingface/transformers", "onnxruntime-web", ORT_COMMON)
LOCK = PLAYGROUND_DIR / "package-lock.json"
RECORD = "gptedge-web-deps.json"  # in a fetched cache folder: what was fetched, from where, with which integrity
# each package's licence as its tarball carries it (onnxruntime's packages state theirs in README.md + package.json)
LICENCE = re.compile(r"(?i)^(licen[cs]e|notice|copying)(\.[a-z]+)?$|^readme\.md$")


class WebDepsMissing(GptEdgeError):
    """The playground's npm packages are not installed."""


@dataclass(frozen=True)
class Pinned:
    """One package the lock pins: where it sits in node_modules, its npm name, version and sha512 integrity."""

    path: str  # relative to node_modules, e.g. onnxruntime-web/node_modules/onnxruntime-common
    name: str
    version: str
    integrity: str  # "sha512-<base64>"

    def url(self, registry: str) -> str:
        return f"{registry.rstrip('/')}/{self.name}/-/{self.name.split('/')[-1]}-{self.version}.tgz"

    def wanted(self, relative: str) -> bool:
        """Whether a file of this package's tarball (path inside the package) is kept."""
        full = f"{self.path}/{relative}"
        if "/" not in relative and (LICENCE.match(relative) or relative == "package.json"):
            return True
        return full in VENDOR_FILES or any(full.startswith(d + "/") for d in VENDOR_DIRS)


def pinned_packages(lock_path: Path | None = None) -> list[Pinned]:
    """The lock's (default: the shipped one) entries for PACKAGES; WebDepsMissing when one is missing or has
    no sha512 integrity."""
    lock_path = lock_path or LOCK
    try:
        entries = json.loads(lock_path.read_text(encoding="utf-8"))["packages"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise WebDepsMissing(f"{lock_path}: not an npm package-lock.json with `packages` ({e})") from None
    found = []
    for path in PACKAGES:
        entry = entries.get(f"node_modules/{path}")
        integrity = [i for i in str((entry or {}).get("integrity", "")).split() if i.startswith("sha512-")]
        if not entry or not entry.get("version") or not integrity:
            raise WebDepsMissing(f"{lock_path}: no version and sha512 integrity for node_modules/{path}")
        name = entry.get("name") or path.rsplit("node_modules/", 1)[-1]
        found.append(Pinned(path, name, entry["version"], integrity[0]))
    return found


def cache_folder(pinned: list[Pinned]) -> Path:
    """The cache folder for these pins (node_modules is inside it)."""
    digest = hashlib.sha256("\n".join(p.integrity for p in pinned).encode()).hexdigest()[:12]
    return cache_dir() / "web" / f"transformers-{pinned[0].version}-{digest}"


def cached_node_modules(lock_path: Path | None = None) -> Path | None:
    """The cache's node_modules for the shipped lock when a fetch completed it, else None."""
    try:
        folder = cache_folder(pinned_packages(lock_path))
    except WebDepsMissing:
        return None
    return folder / "node_modules" if (folder / RECORD).is_file() else None


def node_modules() -> Path:
    """The node_modules holding the playground's packages: $GPTEDGE_WEB_MODULES when set, else the source
    checkout's (npm ci), else the user cache `gptedge fetch-web` fills (a wheel install); WebDepsMissing (one line,
    with the fix) when none has them."""
    if os.environ.get("GPTEDGE_WEB_MODULES"):  # named explicitly: used or refused, never passed over
        root = Path(os.environ["GPTEDGE_WEB_MODULES"])
        missing = missing_vendor_file(root)
        if missing:
            raise WebDepsMissing(f"GPTEDGE_WEB_MODULES={root}: {root / missing} is missing (it must be a "
                                 "node_modules holding the playground's packages)")
        return root
    checkout = PLAYGROUND_DIR / "node_modules"
    if not missing_vendor_file(checkout):
        return checkout
    cached = cached_node_modules()
    if cached is not None and not missing_vendor_file(cached):
        return cached
    if checkout.is_dir():  # a source checkout whose npm ci is incomplete or stale
        absent = checkout / missing_vendor_file(checkout)
        raise WebDepsMissing(f"the playground's JavaScript is incomplete ({absent} is missing): run "
                             f"`npm ci --ignore-scripts` in {PLAYGROUND_DIR}, or `gptedge fetch-web`")
    raise WebDepsMissing("the playground's JavaScript is not installed: run `gptedge fetch-web` (downloads the "
                         "pinned transformers.js and onnxruntime-web once into the user cache, about 15 MB kept), "
                         "or set GPTEDGE_WEB_MODULES to a node_modules holding them")


def missing_vendor_file(root: Path) -> str | None:
    """The first VENDOR_FILES entry absent from root, else None."""
    return next((f for f in VENDOR_FILES if not (root / f).is_file()), None)


def vendor_path(relative: str, root: Path | None = None) -> Path | None:
    """A file a browser may fetch from node_modules (VENDOR_FILES or under VENDOR_DIRS), or None: nothing else is
    served, and no path leaves the folder."""
    root = root or node_modules()
    parts = Path(relative).parts
    if not parts or ".." in parts or Path(relative).is_absolute():
        return None
    allowed = relative in VENDOR_FILES or any(relative.startswith(d + "/") for d in VENDOR_DIRS)
    path = root / relative
    return path if allowed and path.is_file() else None


def copy_vendor(dest: Path, root: Path | None = None) -> int:
    """Copy what the page needs from node_modules into dest (dest/vendor/...); -> bytes copied."""
    root = root or node_modules()
    total = 0
    files = [root / f for f in VENDOR_FILES] + [p for d in VENDOR_DIRS for p in sorted((root / d).rglob("*"))
                                               if p.is_file()]
    for src in files:
        target = dest / "vendor" / src.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)
        total += target.stat().st_size
    return total


def copy_page(dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name in PAGE_FILES:
        shutil.copyfile(PLAYGROUND_DIR / name, dest / name)


def versions(root: Path | None = None) -> dict[str, str]:
    """The installed versions of the packages the page runs (recorded in packs and benchmark output)."""
    root = root or node_modules()
    found = [json.loads((root / name / "package.json").read_text(encoding="utf-8")) for name in PACKAGES]
    return {p["name"]: p["version"] for p in found}
