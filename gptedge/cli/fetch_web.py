"""`gptedge fetch-web`: download, once, the playground's JavaScript (transformers.js + onnxruntime-web) that the
shipped package-lock.json pins, into the user cache, for `pack --target web` and `serve`'s playground on an install
without a source checkout (gptedge.pack.web_fetch)."""

from __future__ import annotations

import click

from gptedge.pack.web_fetch import DEFAULT_REGISTRY, fetch_web_deps

from .group import command
from .options import diag


def http_url(ctx, param, value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise click.BadParameter(f"{value!r} is not an http(s) URL")
    return value


@command("fetch-web")
@click.option("--registry", default=DEFAULT_REGISTRY, show_default=True, envvar="GPTEDGE_NPM_REGISTRY",
              callback=http_url,
              help="The npm registry (or mirror) to download from; also $GPTEDGE_NPM_REGISTRY. The tarballs are "
                   "checked against the lock's sha512 integrity wherever they come from.")
def fetch_web(registry: str) -> None:
    """Fetch the pinned transformers.js and onnxruntime-web tarballs, check their integrity, and keep the files a
    browser needs (about 15 MB) in $GPTEDGE_CACHE/web (else $XDG_CACHE_HOME/gptedge/web, else ~/.cache/gptedge/web).
    Needed once per install from a wheel; a source checkout's `npm ci` serves as well. Prints the folder."""
    result = fetch_web_deps(registry)
    names = ", ".join(f"{name} {version}" for name, version in result["versions"].items())
    if result["fetched"]:
        diag(f"fetched {names} ({result['downloaded'] / 1e6:.1f} MB downloaded, integrity checked); kept "
             f"{result['bytes'] / 1e6:.1f} MB")
    else:
        diag(f"already fetched: {names} ({result['bytes'] / 1e6:.1f} MB)")
    click.echo(str(result["node_modules"]))
