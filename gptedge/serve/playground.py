"""The playground at `/` of `gptedge serve`: the page, its JavaScript, and the packed model it runs in the browser.

Routes (no API key: the page is public like /health; the completions it calls stay behind --api-key):

    /                   index.html           /playground.js      its one JS module
    /playground.json    what the page offers: "on the server" (this server's model, /v1/completions, and
                        /v1/chat/completions when the model has a chat template) and "in this browser" (web-model/,
                        or why not)
    /vendor/<path>      transformers.js and onnxruntime-web's WASM, from the playground's node_modules (only the
                        files js_deps.VENDOR_FILES names)
    /web-model/<path>   the packed model (`gptedge pack --target web` layout): `serve --web DIR` names one, or the
                        served MODEL is packed into a temporary folder at start when it is web-ready

Every response carries the cross-origin isolation headers (COOP same-origin, COEP require-corp), so the page may
use SharedArrayBuffer and onnxruntime-web runs its WASM kernels on several threads.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from gptedge.atomic import PACK_MANIFEST
from gptedge.pack.page import page_settings
from gptedge.pack.js_deps import PLAYGROUND_DIR, WebDepsMissing, node_modules, vendor_path
from gptedge.runtime.errors import GptEdgeError
from gptedge.runtime.modeldir.manifest import Manifest
from gptedge.runtime.modeldir.web_ready import web_readiness

log = logging.getLogger(__name__)

ISOLATION = {"Cross-Origin-Opener-Policy": "same-origin", "Cross-Origin-Embedder-Policy": "require-corp",
             "Cross-Origin-Resource-Policy": "same-origin"}
# module scripts must come as JavaScript and WASM as application/wasm (streaming compile); not left to mimetypes
MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
               ".mjs": "text/javascript; charset=utf-8", ".json": "application/json", ".wasm": "application/wasm",
               ".md": "text/plain; charset=utf-8"}
WEB_MODEL_URL = "web-model/"


@dataclass(frozen=True)
class Playground:
    model_name: str
    api_key_required: bool
    web_dir: Path | None  # the packed folder the browser fetches, or None
    unavailable: str | None = None  # why the browser mode is off
    chat: bool = False  # the served model has a chat template: the page offers a chat (/v1/chat/completions)

    def settings(self) -> dict:
        server = {"model": self.model_name, "completions": "/v1/completions",
                  "api_key_required": self.api_key_required}
        if self.chat:
            server["chat"] = "/v1/chat/completions"
        else:
            server["chat_unavailable"] = (f"{self.model_name} has no chat template (serve --chat-template FILE gives "
                                          "it one)")
        return page_settings(WEB_MODEL_URL if self.web_dir else None, server, self.unavailable)


@contextlib.contextmanager
def web_model(model_dir: Path, manifest: Manifest, web: str,
              chat_template: str | None = None) -> Iterator[tuple[Path | None, str | None]]:
    """The packed folder the browser mode serves -> (folder, None) or (None, why not).

    `web`: "off", "auto" (pack MODEL into a temporary folder, removed on exit, when it is web-ready, with
    `chat_template` (serve --chat-template) when given), or a folder `gptedge pack --target web` wrote."""
    if web == "off":
        yield None, "turned off (serve --web off)"
        return
    if web != "auto" and not (Path(web) / PACK_MANIFEST).is_file():
        raise GptEdgeError(f"--web {web}: no {PACK_MANIFEST} (not a folder `gptedge pack --target web` wrote)")
    try:
        node_modules()
    except WebDepsMissing as e:
        yield None, str(e)
        return
    if web != "auto":
        yield Path(web), None
        return
    ready = web_readiness(manifest)
    if not ready.ready:
        yield None, f"{model_dir.name} is not web-ready: {ready.reason}"
        return
    try:
        from gptedge.pack.web import write_web_model  # needs onnx (the quantize extra)
    except ImportError as e:
        yield None, f"packing needs {e.name} (pip install 'gptedge[quantize]'), or pass --web DIR"
        return
    sweep_stale_web_folders()
    folder = Path(tempfile.mkdtemp(prefix=f"{WEB_PREFIX}{os.getpid()}-"))
    try:
        write_web_model([model_dir], folder, chat_template)
        yield folder, None
    finally:
        shutil.rmtree(folder, ignore_errors=True)


WEB_PREFIX = "gptedge-web-"  # then the serving process's pid, "-", mkdtemp's suffix


def sweep_stale_web_folders(root: str | Path | None = None) -> list[Path]:
    """Remove the web packs that servers killed with SIGKILL left (a full copy of the model each: the `finally`
    never ran): a gptedge-web-PID-* folder whose process is gone. -> the folders removed."""
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(f"{WEB_PREFIX}*-*"):
        pid = folder.name[len(WEB_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        log.info("removed %s, the web pack of a server that is gone (pid %s)", folder, pid)
        removed.append(folder)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _file(path: Path | None) -> Response:
    if path is None:
        return JSONResponse({"error": {"message": "not found", "type": "invalid_request_error"}}, status_code=404,
                            headers=ISOLATION)
    return FileResponse(path, media_type=MEDIA_TYPES.get(path.suffix, "application/octet-stream"), headers=ISOLATION)


def _confined(root: Path, relative: str) -> Path | None:
    """root/relative if it is a file inside root (no .., no links out), else None."""
    path = (root / relative).resolve()
    return path if path.is_file() and path.is_relative_to(root.resolve()) else None


def playground_routes(playground: Playground) -> list[Route]:
    modules = None
    with contextlib.suppress(WebDepsMissing):
        modules = node_modules()

    async def page(request: Request) -> Response:
        return _file(PLAYGROUND_DIR / "index.html")

    async def script(request: Request) -> Response:
        return _file(PLAYGROUND_DIR / "playground.js")

    async def settings(request: Request) -> Response:
        return JSONResponse(playground.settings(), headers=ISOLATION)

    async def vendor(request: Request) -> Response:
        return _file(vendor_path(request.path_params["path"], modules) if modules else None)

    async def model_file(request: Request) -> Response:
        web_dir = playground.web_dir
        return _file(_confined(web_dir, request.path_params["path"]) if web_dir else None)

    return [Route("/", page), Route("/playground.js", script), Route("/playground.json", settings),
            Route("/vendor/{path:path}", vendor), Route(f"/{WEB_MODEL_URL}{{path:path}}", model_file)]
