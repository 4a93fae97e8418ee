"""A local npm registry for `gptedge fetch-web` tests (no network): tarballs made from a node_modules folder as
npm packs them (`package/...`), a package-lock.json pinning their sha512 integrity, and a loopback HTTP server
serving them at npm's URLs; a route may drop its connection halfway (an interrupted download)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from gptedge.pack.js_deps import Pinned


def integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def tarball(package_dir: Path, keep=lambda relative: True) -> bytes:
    """package_dir's files (those `keep` takes, by path inside the package) as npm's .tgz: under `package/`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        for path in sorted(p for p in package_dir.rglob("*") if p.is_file()):
            relative = path.relative_to(package_dir).as_posix()
            if "node_modules/" not in relative and keep(relative):  # a nested package is its own tarball
                tar.add(path, arcname=f"package/{relative}")
    return buffer.getvalue()


def registry_for(node_modules: Path, lock: dict, keep_all: bool = False) -> tuple[dict, dict[str, bytes]]:
    """-> (a copy of `lock` pinning tarballs of node_modules' packages, {URL path: tarball}) for the packages the
    lock names in js_deps.PACKAGES; keep_all=False packs only the files fetch-web keeps (smaller, faster)."""
    from gptedge.pack.js_deps import PACKAGES

    lock = json.loads(json.dumps(lock))
    routes = {}
    for path in PACKAGES:
        entry = lock["packages"].setdefault(f"node_modules/{path}", {"version": "1.0.0"})
        name = entry.get("name") or path.rsplit("node_modules/", 1)[-1]
        pin = Pinned(path, name, entry["version"], "")
        data = tarball(node_modules / path, (lambda r: True) if keep_all else pin.wanted)
        entry["integrity"] = integrity(data)
        entry.pop("resolved", None)
        routes[pin.url("")] = data
    return lock, routes


class _Handler(BaseHTTPRequestHandler):
    routes: dict[str, bytes] = {}
    truncated: set[str] = set()

    def do_GET(self):  # noqa: N802 - http.server's name
        data = self.routes.get(self.path)
        if data is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.path in self.truncated:  # half the body, then the connection drops
            self.wfile.write(data[: len(data) // 2])
            self.close_connection = True
            return
        self.wfile.write(data)

    def log_message(self, *args):  # quiet
        pass


@contextlib.contextmanager
def serve_registry(routes: dict[str, bytes], truncated: set[str] = frozenset()) -> Iterator[str]:
    """Serve routes ({URL path: bytes}) on loopback -> the registry URL."""
    handler = type("Handler", (_Handler,), {"routes": routes, "truncated": set(truncated)})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
