"""`gptedge serve`'s option types and checks: every bad value exits 2 with its range, before the model loads.

An API key must be printable ASCII (0x20..0x7e) with no space at either end: HTTP carries the
`Authorization` header as bytes a client sends as ASCII, and the header's value is stripped, so
`--api-key "clé"` or `" sp "` would start a server that refuses every correct key.
"""

from __future__ import annotations

import math

import click

from .protocol import PROTOCOLS  # stdlib only at import: uvicorn is imported when a protocol is chosen

# click only: the CLI imports this module at --help, which must not load numpy or starlette (limits.py does)
DEFAULT_MAX_BODY = 4 * 2**20
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 30.0

MAX_BATCH = 256  # rows of one decode step (each a slot of the KV cache)
MAX_QUEUE = 100_000
MAX_PREFILL_CHUNK = 8192  # --prefill-budget's ceiling; default PREFILL_CHUNK (GPU_PREFILL_BUDGET on CUDA)
MAX_PREFIX_CACHE_MB = 2**20  # --prefix-cache-mb's ceiling (1 TiB); its default is the runtime's PREFIX_CACHE_MB
MAX_SECONDS = 3600.0
MIN_BODY = 1024  # bytes: room for any sane completion request
MAX_BODY = 2**30
MAX_ROWS = 1024  # a classifier's rows per ONNX Runtime run
MAX_EXAMPLES = 100_000  # examples one /v1/classify request may hold
MAX_BATCH_WAIT_S = 60.0


class Seconds(click.ParamType):
    """A finite number of seconds in low..high (click's FloatRange lets NaN through: every comparison is false)."""

    name = "seconds"

    def __init__(self, low: float, high: float = MAX_SECONDS):
        self.low, self.high = low, high

    def convert(self, value, param, ctx):
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of {self.name}", param, ctx)
        if not (math.isfinite(seconds) and self.low <= seconds <= self.high):
            self.fail(f"{value} is not in the range {self.low:g}<=x<={self.high:g} ({self.name})", param, ctx)
        return seconds


class Milliseconds(Seconds):
    """A finite number of milliseconds in low..high."""

    name = "milliseconds"


def api_key(ctx, param, value: str | None) -> str | None:
    """click callback: printable ASCII, no surrounding spaces (see the module docstring); '' means none."""
    if not value:
        return None
    bad = next((c for c in value if not " " <= c <= "~"), None)
    if bad is not None:
        raise click.BadParameter(f"must be printable ASCII (0x20..0x7e); it holds {bad!r}", ctx, param)
    if value != value.strip():
        raise click.BadParameter("must not begin or end with a space (the Authorization header's value is stripped)",
                                 ctx, param)
    return value


def model_name(ctx, param, value: str | None) -> str | None:
    """click callback: a model id clients can send back: printable, without control characters, <= 256 chars."""
    if value is None:
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise click.BadParameter("must be valid UTF-8", ctx, param) from None
    if not value.strip() or len(value) > 256 or not value.isprintable():
        raise click.BadParameter("must be 1..256 printable characters", ctx, param)
    return value


def limit_options(fn):
    """What one client may cost: body size, header and body read timeouts."""
    for opt in reversed([
        click.option("--max-body", default=DEFAULT_MAX_BODY, show_default=True, type=click.IntRange(MIN_BODY, MAX_BODY),
                     help="Largest request body in bytes (413 beyond; enforced while reading)."),
        click.option("--header-timeout", default=DEFAULT_HEADER_TIMEOUT_S, show_default=True, type=Seconds(0.1),
                     help="Seconds a client has to send a request's headers; slower connections are closed."),
        click.option("--body-timeout", default=DEFAULT_BODY_TIMEOUT_S, show_default=True, type=Seconds(0.1),
                     help="Seconds a client has to send a request's body after its headers (408 beyond)."),
        click.option("--http", default="auto", show_default=True, type=click.Choice(PROTOCOLS),
                     help="HTTP/1.1 parser and writer: httptools (auto: when installed; cheaper per streamed token) "
                          "or h11."),
    ]):
        fn = opt(fn)
    return fn


def classify_options(fn):
    """A classifier dir's batching (gptedge.runtime.serving.classify_batcher) and per-request limit; unused for a
    language model."""
    for opt in reversed([
        click.option("--max-rows", default=32, show_default=True, type=click.IntRange(1, MAX_ROWS),
                     help="Classifier dirs: token rows per ONNX Runtime run; concurrent requests share a run."),
        click.option("--max-examples", default=256, show_default=True, type=click.IntRange(1, MAX_EXAMPLES),
                     help="Classifier dirs: examples one /v1/classify request may hold (413 beyond)."),
        click.option("--batch-wait", default=0.0, show_default=True, type=Seconds(0, MAX_BATCH_WAIT_S),
                     help="Classifier dirs: seconds a run may wait for more requests to fill --max-rows "
                          "(0: it takes those that arrived during the previous run)."),
    ]):
        fn = opt(fn)
    return fn
