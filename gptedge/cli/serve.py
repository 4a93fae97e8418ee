"""`gptedge serve`: load a model, start the engine, and serve the OpenAI API over HTTP with uvicorn
(the routes are gptedge.serve's).

Starlette and uvicorn (the `serve` extra) and the engine (numpy) are imported when the command runs, so
the base install and `--help` never need them. SIGTERM (or Ctrl-C) stops accepting, lets in-flight
completions finish for up to --shutdown-timeout seconds, cancels what is left, and exits 0 within that
time: requests still sending their bodies get a 503 at once, connections still sending headers are closed.
What one client may cost (body size, header and body read timeouts) is gptedge.serve.limits'; every bad
option exits 2 with its range (gptedge.serve.options).

A classifier dir (its manifest names a task: gptedge export --task) is served by POST /v1/classify instead
(gptedge.serve.classify_app): a batching worker (classify_batcher.py) gathers concurrent requests' examples
into ONNX Runtime runs of at most --max-rows rows; there is no playground page.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import sys
import threading
from pathlib import Path

import click

from gptedge import runtime
from gptedge.runtime.generation.generation_options import (GPU_PREFILL_BUDGET, PREFILL_CHUNK,  # plain Python: light
                                                         PREFIX_CACHE_MB)
from gptedge.runtime.graphs.session import MAX_SPIN_US
from gptedge.runtime.modeldir.chat_template import ChatTemplateError, find_chat_template, render_chat
from gptedge.runtime.modeldir.manifest import MANIFEST_NAME
from gptedge.runtime.serving.classify_batcher import ClassifyBatcher  # threading only: light at --help
from gptedge.sample import sample_model_dir
from gptedge.serve.options import (MAX_BATCH, MAX_PREFILL_CHUNK, MAX_PREFIX_CACHE_MB, MAX_QUEUE, Milliseconds, Seconds,
                                   classify_options, limit_options)
from gptedge.serve.options import api_key as api_key_check
from gptedge.serve.options import model_name as model_name_check

from .group import command
from .options import count, device_option, diag, import_extra, threads_option

# What `serve` does with ONNX Runtime's spin-waiting unless told: off | runs (inside a decode step only) | on
DEFAULT_SPIN = "runs"
# --spin-in-runs' bound on one spin (us) unless --spin-us says: past it a thread sleeps, inside a step too. Unbounded,
# spinning inside runs took 1.4x --no-spin's CPU per token at 8 clients on a shared 2-core host, bounded 1.2x
# (benchmarks/results/serve-spin-2026-11-26.md)
RUN_SPIN_US = 100


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _listen(host: str, port: int) -> socket.socket:
    """Bind and listen before the server starts, so the real port (with --port 0) is known and printed."""
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(info[0], socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(info[4])
        sock.listen(2048)
    except OSError as e:
        raise click.ClickException(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


@command()
@click.argument("model", required=False, type=click.Path(path_type=str))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (loopback by default).")
@click.option("--port", default=8000, show_default=True, type=count(0, 65535),
              help="0: any free port (printed on stderr).")
@click.option("--max-batch", default=8, show_default=True, type=count(1, MAX_BATCH), help="Sequences decoded together.")
@click.option("--prefill-budget", default=None, type=count(1, MAX_PREFILL_CHUNK),
              help="Prompt positions (padding counted) one prefill run may take between two decode steps: "
                   "newcomers whose prompts fit are prefilled together, a longer prompt in chunks. Smaller: "
                   f"running streams stall less; larger: a burst's first tokens come sooner. [default: "
                   f"{GPU_PREFILL_BUDGET} for a kv_buffer dir on CUDA (one launch-bound run takes a burst), else "
                   f"{PREFILL_CHUNK}]")
@click.option("--prefill-hold-ms", default=0.0, show_default=True, type=Milliseconds(0, 1000),
              help="Milliseconds newcomers may wait while rows decode (or until 8 or as many as there are free "
                   "rows wait), so that several share one prefill run: for a GPU, where a run costs about a decode "
                   "step whatever it holds, under requests that arrive one by one.")
@click.option("--prefix-cache-mb", default=PREFIX_CACHE_MB, show_default=True, type=count(0, MAX_PREFIX_CACHE_MB),
              help="MiB of memory for the keys and values of prompt prefixes seen before: a prompt that starts with "
                   "one (a system prompt, a conversation's history) prefills only the rest. Least recently used "
                   "blocks go first; 0 turns reuse off.")
@click.option("--spin-in-runs", "spin", flag_value="runs", default=DEFAULT_SPIN,
              help="ONNX Runtime's threads spin-wait inside a decode step (between its parallel sections, at most "
                   f"--spin-us, default {RUN_SPIN_US} us, at a time) and sleep the moment the step ends, yielding the "
                   "cores to the HTTP side between steps (the default).")
@click.option("--spin", "spin", flag_value="on",
              help="Let ONNX Runtime's threads spin-wait between runs too (its own default).")
@click.option("--no-spin", "spin", flag_value="off",
              help="Never spin: threads sleep as soon as they run out of work, inside a step too.")
@click.option("--spin-us", default=None, type=count(1, MAX_SPIN_US),
              help="Spin, but at most this many microseconds after each piece of work before sleeping (implies "
                   "spinning; with --spin-in-runs, none after a step either).")
@click.option("--max-queue", default=64, show_default=True, type=count(1, MAX_QUEUE),
              help="Requests waiting for a batch row; beyond it requests get 429.")
@click.option("--max-tokens-limit", default=None, type=count(1),
              help="Largest max_tokens a request may ask for, 1..context (default: the model's context).")
@click.option("--api-key", envvar="GPTEDGE_API_KEY", default=None, callback=api_key_check,
              help="Require 'Authorization: Bearer KEY' on /v1 (also $GPTEDGE_API_KEY); printable ASCII.")
@click.option("--model-name", default=None, callback=model_name_check,
              help="The model id clients send (default: MODEL's folder name).")
@threads_option
@device_option
@click.option("--shutdown-timeout", default=10.0, show_default=True, type=Seconds(0),
              help="Seconds in-flight requests may finish after SIGTERM before they are cancelled.")
@limit_options
@classify_options
@click.option("--chat-template", "chat_template", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="A Jinja chat template for POST /v1/chat/completions, in place of the model dir's own "
                   "(chat_template.jinja, copied from the checkpoint at export).")
@click.option("--web", default="auto", show_default=True,
              help="The playground's 'in this browser' model: auto packs MODEL at start when it is web-ready, "
                   "off turns it off, or a folder `gptedge pack --target web` wrote.")
def serve(model: str | None, host: str, port: int, max_batch: int, prefill_budget: int | None, prefill_hold_ms: float,
          prefix_cache_mb: int,
          spin: str, spin_us: int | None, max_queue: int,
          max_tokens_limit: int | None, api_key: str | None, model_name: str | None, threads: int, device: str,
          shutdown_timeout: float, web: str, max_body: int, header_timeout: float, body_timeout: float, http: str,
          max_rows: int, max_examples: int, batch_wait: float, chat_template: Path | None) -> None:
    """Serve MODEL (default: the shipped sample model) over OpenAI's completions API: /v1/completions
    (streaming too), /v1/models, /health and /metrics; and the playground page at / (on the server, or in the
    browser with onnxruntime-web). A classifier dir (export --task) is served by POST /v1/classify instead."""
    uvicorn = import_extra("uvicorn", "serve")
    app = import_extra("gptedge.serve.app", "serve")  # starlette
    page = import_extra("gptedge.serve.playground", "serve")
    limits = import_extra("gptedge.serve.limits", "serve").Limits(max_body=max_body, header_timeout=header_timeout,
                                                                  body_timeout=body_timeout, http=http)
    _check_http(http)
    if model is None:
        model, name = str(sample_model_dir()), model_name or "gptedge-sample"
    else:
        name = model_name or Path(model).resolve().name
    if (Path(model) / MANIFEST_NAME).is_file() and runtime.read_manifest(model).task is not None:
        return _serve_classifier(uvicorn, app, model, name, host, port, max_queue, api_key, threads, device,
                                 shutdown_timeout, limits, max_rows, max_examples, batch_wait)
    template = _read_chat_template(chat_template) if chat_template is not None else None
    if spin == "runs" and spin_us is None:
        spin_us = RUN_SPIN_US
    loaded = runtime.load(model, device=device, session=runtime.SessionConfig(
        threads=threads, spin=spin != "off" or spin_us is not None, spin_us=spin_us,
        spin_between_runs=spin != "runs"))
    _ = loaded.tokenizer  # fail on a missing tokenizer before serving
    context = loaded.manifest.shape.context_length
    if max_tokens_limit is not None and max_tokens_limit > context:
        raise click.BadParameter(f"{max_tokens_limit} is not in the range 1<=x<={context} (the model's context)",
                                 param_hint="'--max-tokens-limit'")
    chat = template if template is not None else find_chat_template(model)  # what /v1/chat/completions renders
    with page.web_model(Path(model), loaded.manifest, web, chat) as (web_dir, unavailable):  # a temporary pack
        routes = page.playground_routes(page.Playground(name, bool(api_key), web_dir, unavailable, chat is not None))
        _run(uvicorn, app, loaded, model, name, host, port, max_batch, prefill_budget, prefix_cache_mb, max_queue,
             max_tokens_limit or context, api_key, shutdown_timeout, routes, unavailable, limits, template,
             prefill_hold_ms)


def _check_http(http: str) -> None:
    """--http's protocol importable, before the model loads: one line naming the option otherwise."""
    try:
        import_extra("gptedge.serve.protocol", "serve").base_protocol(http)
    except ImportError:
        raise click.BadParameter("httptools is not installed (pip install httptools; --http auto falls back to h11)",
                                 param_hint="'--http'") from None


def _read_chat_template(path: Path) -> str:
    """The file's template, checked to parse before the model loads; one line when it cannot be read or parsed."""
    try:
        template = path.read_text(encoding="utf-8")
        render_chat(template, [{"role": "user", "content": "hi"}])
    except (OSError, UnicodeDecodeError) as e:
        raise click.BadParameter(f"cannot read {path}: {getattr(e, 'strerror', None) or e}",
                                 param_hint="'--chat-template'") from None
    except ChatTemplateError as e:
        if "does not parse" in str(e):
            raise click.BadParameter(f"{path}: {e}", param_hint="'--chat-template'") from None
    return template


def _serve_classifier(uvicorn, app, model: str, name: str, host: str, port: int, max_queue: int, api_key: str | None,
                      threads: int, device: str, shutdown_timeout: float, limits, max_rows: int, max_examples: int,
                      batch_wait: float) -> None:
    """A classifier dir: load it, start the batching worker, serve /v1/classify until a signal stops it."""
    clf = runtime.load_classifier(model, device=device, session=runtime.SessionConfig(threads=threads))
    sock = _listen(host, port)
    batcher = ClassifyBatcher(clf, max_rows=max_rows, max_queue=max_queue, wait_s=batch_wait).start()
    state = app.ServeState(app.Classifying(clf, batcher, max_examples), name, api_key or None, limits=limits)
    diag(f"loaded {model} ({clf.manifest.precision}, {clf.task.name} classifier) in {clf.load_s:.2f}s on "
         f"{', '.join(clf.providers)}")
    _serve(uvicorn, app, state, sock, host, api_key, shutdown_timeout, limits, (),
           f"POST /v1/classify, {max_rows} rows a run, queue {max_queue}")


def _serve(uvicorn, app, state, sock, host: str, api_key: str | None, shutdown_timeout: float, limits, routes,
           what: str) -> None:
    """Serve `state` on the bound `sock` until a signal stops it; then stop its engine or batcher."""
    # The whole shutdown fits in --shutdown-timeout: bodies still arriving get a 503 at once (limits.read_body),
    # and in-flight work is cancelled by the engine (or batcher) at the deadline, so uvicorn's own wait never runs
    # out.
    protocols = import_extra("gptedge.serve.protocol", "serve")
    protocol = protocols.timed_protocol(limits.header_timeout, state.dropped, protocols.base_protocol(limits.http))
    config = uvicorn.Config(app.create_app(state, tuple(routes)), log_level="warning", lifespan="off",
                            http=protocol, timeout_graceful_shutdown=shutdown_timeout)
    server = _server(uvicorn, config, state, shutdown_timeout)
    bound = sock.getsockname()
    if not _is_loopback(host) and not api_key:
        diag(f"warning: serving on {host} with no --api-key: anyone who can reach it may use it")
    diag(f"serving '{state.name}' on http://{bound[0]}:{bound[1]} ({what}; pid {os.getpid()})")
    for sig in (signal.SIGTERM, signal.SIGINT):  # uvicorn re-raises the signal after its shutdown: let it land here
        signal.signal(sig, server.handle_exit)
    try:
        server.run(sockets=[sock])
    finally:
        state.stop(0)  # already stopped after a signal; this joins the engine (batcher) thread otherwise
        sock.close()
    diag("server stopped")


def prefill_budget_for(loaded, given: int | None) -> int:
    """--prefill-budget, or its default for the engine's pool: where newcomers share one launch-bound prefill run on
    the GPU (a kv_buffer dir with a wide mask on CUDA), a burst of short prompts in one run
    (generation_options.GPU_PREFILL_BUDGET); elsewhere PREFILL_CHUNK (a pool that prefills each prompt alone, or the
    CPU's, would only stall running rows longer)."""
    if given is not None:
        return given
    return GPU_PREFILL_BUDGET if getattr(loaded.variant, "shares_device_prefills", False) else PREFILL_CHUNK


def _run(uvicorn, app, loaded, model: str, name: str, host: str, port: int, max_batch: int, prefill_budget: int | None,
         prefix_cache_mb: int, max_queue: int,
         max_tokens: int, api_key: str | None, shutdown_timeout: float, routes: list, unavailable: str | None,
         limits, chat_template: str | None = None, prefill_hold_ms: float = 0.0) -> None:
    """Listen, start the engine, and serve until a signal stops it."""
    from gptedge.runtime.serving.engine import Engine  # deferred: numpy, not needed at --help

    sock = _listen(host, port)
    prefill_budget = prefill_budget_for(loaded, prefill_budget)
    engine = Engine(loaded, max_batch=max_batch, max_queue=max_queue, prefill_chunk=prefill_budget,
                    prefix_cache_mb=prefix_cache_mb, prefill_hold_ms=prefill_hold_ms).start()
    state = app.ServeState(app.Generating(engine, loaded, max_tokens, chat_template), name, api_key or None,
                           limits=limits)
    diag(f"loaded {model} ({loaded.manifest.precision}) in {loaded.load_s:.2f}s on {', '.join(loaded.providers)}")
    bound = sock.getsockname()
    diag(f"playground: http://{bound[0]}:{bound[1]}/ (in this browser: {unavailable or 'yes'})")
    _serve(uvicorn, app, state, sock, host, api_key, shutdown_timeout, limits, routes,
           f"max batch {max_batch}, prefill budget {prefill_budget}"
           f"{f' (newcomers held up to {engine.prefill_hold_s * 1000:g} ms)' if engine.prefill_hold_s else ''}, "
           f"queue {max_queue}, "
           f"prefix cache {_prefix_cache_words(engine, prefix_cache_mb)}")


def _prefix_cache_words(engine, cap_mb: int) -> str:
    """How the startup line states prefix reuse: its cap, off, or why this graph's pool has none."""
    if engine.prefix is not None:
        return f"{cap_mb} MiB"
    return "off" if not cap_mb else "unavailable on this device's pool"


def _server(uvicorn, config, state, grace_s: float):
    """uvicorn's Server, whose first exit signal also stops the engine: no new requests, in-flight ones get
    `grace_s` to finish, then are cancelled; uvicorn waits for their responses to end, then returns."""

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            if not state.stopping:
                state.stopping = True
                sys.stderr.write(f"signal {signal.Signals(sig).name}: finishing in-flight requests "
                                 f"(up to {grace_s:g}s), then exiting\n")
                threading.Thread(target=state.stop, args=(grace_s,), name="gptedge-stop", daemon=True).start()
            super().handle_exit(sig, frame)

    return Server(config)
