"""Load benchmark of `gptedge serve`: C concurrent clients streaming completions, per model.

    python benchmarks/make_gpt2_small.py --out .cache/bench/gpt2-small
    gptedge export .cache/bench/gpt2-small -o .cache/bench/fp32-kvb --graph kv_buffer
    gptedge quantize .cache/bench/fp32-kvb -o .cache/bench/dynamic-kvb --method dynamic
    python benchmarks/serve_load.py .cache/bench/fp32-kvb .cache/bench/dynamic-kvb \\
        [--clients 1,2,4,8,16] [--prompt 32] [--new 128] [--requests 2] [--threads 2] [--max-batch 16] \\
        [--client-procs 1]

For each model it first times `generate` in-process (what `gptedge generate` runs: same prompts, threads and
greedy decoding), then starts `gptedge serve MODEL --port 0` on loopback in a process of its own, warms it up,
and for each C runs C clients at once, each sending --requests streaming completions one after another
(--prompt seeded random token ids, different for every request; --new tokens, greedy, `ignore_eos` so every
request decodes all of them). Needs the `serve` and `test` extras (httpx).

Printed per model: per C, total generated tok/s (all clients' tokens over the wall time), p50/p99 time to first
token (request sent -> first text chunk) and p50/p99 inter-token latency (gap between text chunks; a chunk
holding back half a UTF-8 character carries two tokens, so this errs high); then one client's decode rate
through HTTP next to generate's, and the server's peak RSS (VmHWM) next to the model's size on disk; and the
docs/performance.md#targets as met or missed. Timings mean something only on a quiet machine.
`--serve-args='--spin'` appends options to every `gptedge serve` it starts (an A/B of a serve option).
`--trace PREFIX` starts the server through engine_trace.py and prints where its engine thread's time went.

With `--peer llama-server` the same load also runs against llama.cpp's own server, interleaved, and one comparison
table comes out (`--out FILE.md` writes it too, with every figure in FILE.json):

    GPTEDGE_LLAMA_SERVER=BUILD/bin/llama-server GPTEDGE_LLAMA_CPP_SOURCE=llama_cpp_python-X.tar.gz \\
    python benchmarks/serve_load.py WO8_DIR DYNAMIC_DIR WO4_DIR --peer llama-server [--checkpoint HF_DIR] \\
        [--peer-recipes Q8_0,Q4_K_M] [--runs 2] [--work .cache/bench/llama-server] [--out FILE.md]

llama-server is built from the llama.cpp vendored in llama-cpp-python's sdist (the version whose `llama_cpp`
quantizes the GGUFs here):

    cmake -S SDIST/vendor/llama.cpp -B BUILD -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \\
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
    cmake --build BUILD --target llama-server -j

The checkpoint (default: the one the first dir's manifest was exported from; it must hold the same weights) is
converted once to an f32 GGUF by llama.cpp's own converter and quantized once per recipe by llama.cpp
(gptedge/measure/peers/llama_cpp.py), under --work/CHECKPOINT-HASH, reused after. Each run starts every gptedge dir's
server and then every recipe's `llama-server -m GGUF -t T -tb T -np B -c B*CONTEXT --host 127.0.0.1 --port P` (B: the
same max batch gptedge gets, so each slot holds the model's whole context), waits for GET /health, sends the same
warm-up and the same prompts as to gptedge (prompt ids, `cache_prompt: false` so a prompt repeated at the next
client count is prefilled again, as gptedge does), and reads its peak RSS (VmHWM) the same way. The runs interleave
(run 1: every gptedge dir, then every recipe; run 2 the same again) so drift hits both sides. The targets pair
weight-only 8-bit with Q8_0 and weight-only 4-bit with Q4_K_M; other dirs are reported beside, not judged.
`--peer-args='...'` appends llama-server options: `--cache-ram 0` turns off its host-memory prompt cache (on by
default: each finished slot's KV is saved there when the slot takes a new request, and counts in its peak RSS).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # serve_peer beside it, also when loaded by path (tests)

ROOT = Path(__file__).resolve().parents[1]
KEEP_ALIVE_ENV = "SERVE_LOAD_KEEP_ALIVE"  # set: clients reuse their connections (--keep-alive)


@dataclass
class RequestTiming:
    sent: float
    chunks: list[float] = field(default_factory=list)  # arrival time of each chunk with text
    tokens: int = 0
    counted_by: str = ""  # "usage" (the server's count), "timings" (llama-server's predicted_n) or "chunks"
    predicted: int | None = None  # llama-server's timings.predicted_n, where its last chunk has it

    @property
    def ttft(self) -> float:
        return self.chunks[0] - self.sent

    @property
    def gaps(self) -> list[float]:
        return list(np.diff(self.chunks))

    @property
    def decode_rate(self) -> float:  # tokens after the first, over the time after the first
        span = self.chunks[-1] - self.chunks[0]
        return (self.tokens - 1) / span if span > 0 else 0.0


def read_event(timing: RequestTiming, line: str, at: float) -> None:
    """One line of a streamed completion (server-sent events) into `timing`; `at` is when it arrived.

    gptedge ends with a chunk holding only `usage` (stream_options.include_usage); llama-server sends `usage` and
    its `timings` on its last chunk, beside an empty text, and opens with an empty-text chunk (to send the
    headers early): neither counts as an arrival. Both hold back a token that ends inside a UTF-8 character."""
    if not line.startswith("data: {"):
        return  # blank separators, `data: [DONE]`
    chunk = json.loads(line[6:])
    if "error" in chunk:
        raise RuntimeError(f"the stream ended in an error: {chunk['error']}")
    if chunk.get("usage"):
        timing.tokens, timing.counted_by = chunk["usage"]["completion_tokens"], "usage"
    if isinstance(chunk.get("timings"), dict) and "predicted_n" in chunk["timings"]:
        timing.predicted = chunk["timings"]["predicted_n"]
    choices = chunk.get("choices") or []
    if choices and choices[0].get("text"):
        timing.chunks.append(at)


def settle_tokens(timing: RequestTiming) -> RequestTiming:
    """Where the stream had no usage: llama-server's predicted_n, else the chunks with text (an undercount
    where a chunk carries two tokens)."""
    if timing.counted_by != "usage":
        timing.tokens, timing.counted_by = ((timing.predicted, "timings") if timing.predicted is not None
                                            else (len(timing.chunks), "chunks"))
    return timing


def parse_stream(sent: float, lines: Iterable[tuple[float, str]]) -> RequestTiming:
    """A whole recorded stream, (arrival time, line) pairs, as one request's timing."""
    timing = RequestTiming(sent)
    for at, line in lines:
        read_event(timing, line, at)
    return settle_tokens(timing)


def start_server(model: Path, threads: int, max_batch: int, log: Path,
                 extra: list[str] = (), trace: str | None = None) -> tuple[subprocess.Popen, str]:
    """trace: the engine's turns written to TRACE.PID.jsonl as the server exits (engine_trace.py)."""
    launcher = ["-m", "gptedge.cli"] if trace is None else [str(Path(__file__).resolve().parent / "engine_trace.py")]
    cmd = [sys.executable, *launcher, "serve", str(model), "--port", "0", "--model-name", "bench",
           "--threads", str(threads), "--max-batch", str(max_batch), "--max-queue", "256", *extra]
    env = None if trace is None else {**os.environ, "GPTEDGE_ENGINE_TRACE": trace}
    with open(log, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        found = re.search(r"on (http://127\.0\.0\.1:\d+)", log.read_text())
        if found:
            return proc, found.group(1)
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the server did not start:\n{log.read_text()}")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def peak_rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024


async def one_request(http, prompt: list[int], new_tokens: int, extra: dict | None = None) -> RequestTiming:
    body = {"model": "bench", "prompt": prompt, "max_tokens": new_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}, **(extra or {})}
    timing = RequestTiming(time.perf_counter())
    async with http.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            read_event(timing, line, time.perf_counter())
    return settle_tokens(timing)


async def run_clients(url: str, prompts: list[list[int]], clients: int, per_client: int,
                      new_tokens: int, extra: dict | None = None, first: int = 0) -> tuple[list[RequestTiming], float]:
    """Clients first .. first + clients - 1 of a load, each sending per_client streams one after another ->
    (every request's timing, the wall time from the first request to the last answer)."""
    import httpx

    async def client(i: int, http) -> list[RequestTiming]:
        return [await one_request(http, prompts[(i * per_client + k) % len(prompts)], new_tokens, extra)
                for k in range(per_client)]

    # A fresh connection per request, for every server alike: llama-server may close an idle keep-alive connection
    # just as the client reuses it ("Server disconnected without sending a response"); a loopback connect costs
    # ~0.1 ms against first tokens of tens of ms. --keep-alive (KEEP_ALIVE_ENV, seen by the client processes too):
    # each client reuses its connection, as the openai client does.
    kept = clients + 1 if os.environ.get(KEEP_ALIVE_ENV) else 0
    limits = httpx.Limits(max_connections=clients + 1, max_keepalive_connections=kept)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        started = time.perf_counter()
        done = await asyncio.gather(*(client(i, http) for i in range(first, first + clients)))
        wall = time.perf_counter() - started
    return [t for ts in done for t in ts], wall


def _client_share(url: str, prompts: list[list[int]], clients: int, per_client: int, new_tokens: int,
                  extra: dict | None, first: int, start_at: float) -> tuple[list[RequestTiming], float, float]:
    """One client process's share, started at start_at (perf_counter is CLOCK_MONOTONIC: one clock for every
    process of the machine) -> (timings, started, ended)."""
    time.sleep(max(0.0, start_at - time.perf_counter()))
    started = time.perf_counter()
    timings, wall = asyncio.run(run_clients(url, prompts, clients, per_client, new_tokens, extra, first))
    return timings, started, started + wall


def run_load(url: str, prompts: list[list[int]], clients: int, per_client: int, new_tokens: int,
             extra: dict | None = None, procs: int = 1) -> tuple[list[RequestTiming], float]:
    """run_clients, with the clients spread over `procs` processes: one Python process parses ~10k streamed
    chunks a second (httpx, json), below what a GPU server sends at 64 clients, so there the load generator
    itself would be measured. The wall time spans the first process's start to the last one's end."""
    procs = max(1, min(procs, clients))
    if procs == 1:
        return asyncio.run(run_clients(url, prompts, clients, per_client, new_tokens, extra))
    import concurrent.futures
    import multiprocessing

    shares = [clients // procs + (k < clients % procs) for k in range(procs)]
    firsts = [sum(shares[:k]) for k in range(procs)]
    with concurrent.futures.ProcessPoolExecutor(procs, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(time.sleep, [0.0] * procs))  # the processes up (and importing) before the clock starts
        start_at = time.perf_counter() + 3.0  # a process still starting then would start its share late: said below
        futures = [pool.submit(_client_share, url, prompts, n, per_client, new_tokens, extra, f, start_at)
                   for n, f in zip(shares, firsts, strict=True)]
        done = [f.result() for f in futures]
    late = max(s for _, s, _ in done) - start_at
    if late > 0.05:
        print(f"warning: a client process started its share {late * 1000:.0f} ms late", file=sys.stderr)
    return [t for ts, _, _ in done for t in ts], max(e for _, _, e in done) - min(s for _, s, _ in done)


def pct(values, q) -> float:
    return float(np.percentile(values, q)) * 1000 if len(values) else float("nan")


def load_prompts(vocab_size: int, args) -> list[list[int]]:
    """Seeded: the same prompts for every gptedge dir and every peer."""
    from gptedge.measure.bench import bench_prompts

    return bench_prompts(vocab_size, max(args.clients) * args.requests, args.prompt)


def measure_load(url: str, prompts: list[list[int]], args, extra: dict | None = None) -> list[dict]:
    """The warm-up, then per client count C: C clients each sending --requests streams one after another."""
    asyncio.run(run_clients(url, prompts, 1, 1, 8, extra))  # warm-up (and waits for the server to accept)
    rows = []
    for c in args.clients:
        timings, wall = run_load(url, prompts, c, args.requests, args.new, extra, args.client_procs)
        gaps = [g for t in timings for g in t.gaps]
        rows.append({"clients": c, "requests": len(timings), "tok_s": sum(t.tokens for t in timings) / wall,
                     "ttft_p50": pct([t.ttft for t in timings], 50), "ttft_p99": pct([t.ttft for t in timings], 99),
                     "itl_p50": pct(gaps, 50), "itl_p99": pct(gaps, 99),
                     "decode_rate": float(np.median([t.decode_rate for t in timings])),
                     "tokens": [t.tokens for t in timings], "counted_by": sorted({t.counted_by for t in timings})})
    return rows


def bench_model(model: Path, args, in_process: bool = True) -> dict:
    from gptedge.measure.compare import graph_size
    from gptedge.runtime import SessionConfig, load
    from gptedge.runtime.modeldir.manifest import read_manifest

    manifest = read_manifest(model)
    prompts = load_prompts(manifest.shape.vocab_size, args)
    solo = None
    if in_process:  # --peer leaves it out: the comparison is between servers
        loaded = load(model, device=args.device, session=SessionConfig(threads=args.threads))
        loaded.generate(prompts[0], 8, greedy=True, ignore_eos=True)  # warm-up
        solo = [loaded.generate(p, args.new, greedy=True, ignore_eos=True).tokens_per_s for p in prompts[:3]]
        del loaded
    size_mib = graph_size(model, manifest) / 2**20

    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_server(model, args.threads, args.max_batch, Path(tmp) / "serve.log",
                                 [*args.serve_args, "--device", args.device], getattr(args, "trace", None))
        try:
            rows = measure_load(url, prompts, args)
            rss = peak_rss_mib(proc.pid)
        finally:
            stop_server(proc)
    if getattr(args, "trace", None):  # where the engine thread's time went (engine_trace.py)
        from engine_trace import read, summary

        path = f"{args.trace}.{proc.pid}.jsonl"
        try:
            print(f"\nengine trace {path}:\n" + "\n".join(summary(read(path))))
        except OSError as e:  # a server killed rather than stopped writes none: the load's figures still count
            print(f"\nengine trace {path}: not written ({e.strerror})")
    return {"model": str(model), "precision": manifest.precision, "rows": rows,
            "generate_tok_s": float(np.median(solo)) if solo else None, "peak_rss_mib": rss, "size_mib": size_mib}


def report(result: dict) -> None:
    print(f"\n### {result['model']} ({result['precision']})\n")
    print("| clients | requests | total tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in result["rows"]:
        print(f"| {r['clients']} | {r['requests']} | {r['tok_s']:.1f} | {r['ttft_p50']:.1f} | {r['ttft_p99']:.1f} | "
              f"{r['itl_p50']:.2f} | {r['itl_p99']:.2f} |")
    by_c = {r["clients"]: r for r in result["rows"]}
    one = by_c.get(1)
    http_rate, gen_rate = (one["decode_rate"] if one else float("nan")), result["generate_tok_s"]
    print(f"\none client through HTTP: {http_rate:.1f} tok/s decode; generate in-process: {gen_rate:.1f} tok/s "
          f"({http_rate / gen_rate:.0%})")
    rss, size = result["peak_rss_mib"], result["size_mib"]
    print(f"server peak RSS {rss:.0f} MiB; model on disk {size:.0f} MiB; limit 1.5x + 100 = {1.5 * size + 100:.0f} MiB")
    checks = [("peak RSS <= 1.5x model + 100 MiB", rss <= 1.5 * size + 100)]
    if one:
        checks.append(("one client through HTTP >= 90 % of generate's tok/s", http_rate >= 0.9 * gen_rate))
        if 8 in by_c:
            checks.append(("8 clients >= 4x one client's throughput", by_c[8]["tok_s"] >= 4 * one["tok_s"]))
            checks.append(("p99 ITL at 8 clients <= 2.5x one client's", by_c[8]["itl_p99"] <= 2.5 * one["itl_p99"]))
    for name, ok in checks:
        print(f"- {name}: {'met' if ok else 'missed'}")


def serve_args_beside_llama_server(serve_args: list[str]) -> list[str]:
    """gptedge serve's extra options in a --peer run: llama-server's requests carry cache_prompt: false and this load
    repeats its prompts, so gptedge's prefix reuse (on by default) would skip prefills llama-server runs: it is off
    on both sides unless --serve-args sets it."""
    if any(a.split("=")[0] == "--prefix-cache-mb" for a in serve_args):
        return serve_args
    return [*serve_args, "--prefix-cache-mb", "0"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--clients", default="1,2,4,8,16", help="Comma list of concurrent client counts.")
    ap.add_argument("--prompt", type=int, default=32, help="Prompt tokens.")
    ap.add_argument("--new", type=int, default=128, help="New tokens per request.")
    ap.add_argument("--requests", type=int, default=2, help="Requests each client sends, one after another.")
    ap.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads (server and generate).")
    ap.add_argument("--max-batch", type=int, default=None, help="Server's --max-batch (default: the most clients).")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="Where generate and the server run (cuda: the GPU's slot pool and CUDA graphs).")
    ap.add_argument("--client-procs", type=int, default=1,
                    help="Processes the clients are spread over (a GPU server at 64 clients outruns one).")
    ap.add_argument("--keep-alive", action="store_true",
                    help="Each client reuses its connection (the openai client's way) instead of one per request.")
    ap.add_argument("--serve-args", default=None,
                    help="gptedge serve options appended, as --serve-args='--spin' (an A/B of a serve option).")
    ap.add_argument("--trace", default=None, metavar="PREFIX",
                    help="Trace the server's engine turns to PREFIX.PID.jsonl and print where its time went "
                         "(engine_trace.py).")
    peer = ap.add_argument_group("--peer llama-server")
    peer.add_argument("--peer", choices=["llama-server"], help="Run the same load against this server too.")
    peer.add_argument("--checkpoint", type=Path, help="The HF checkpoint the dirs came from (default: the manifest's).")
    peer.add_argument("--peer-recipes", default=None, help="llama.cpp quantizations (default Q8_0,Q4_K_M).")
    peer.add_argument("--peer-args", default=None,
                      help="More llama-server options, one string: --peer-args='--cache-ram 0'.")
    peer.add_argument("--runs", type=int, default=None, help="Interleaved runs (default 2).")
    peer.add_argument("--work", type=Path, default=None, help="GGUFs, reused (default .cache/bench/llama-server).")
    peer.add_argument("--out", type=Path, help="Also write the report here (and every figure in FILE.json).")
    args = ap.parse_args()
    args.clients = [int(c) for c in args.clients.split(",")]
    args.max_batch = args.max_batch or max(args.clients)
    args.serve_args = shlex.split(args.serve_args or "")
    if args.keep_alive:
        os.environ[KEEP_ALIVE_ENV] = "1"  # the client processes inherit it
    if args.peer is None:
        given = [f"--{k.replace('_', '-')}" for k in ("checkpoint", "peer_recipes", "peer_args", "runs", "work", "out")
                 if getattr(args, k) is not None]
        if given:
            ap.error(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} only with --peer llama-server")
        print(f"serve_load: prompt {args.prompt}, new {args.new} (greedy, ignore_eos), {args.requests} requests per "
              f"client{' (one connection each)' if args.keep_alive else ''}, "
              f"server --max-batch {args.max_batch} --threads {args.threads}"
              f"{''.join(' ' + a for a in args.serve_args)}; "
              f"{platform.machine()}, {os.cpu_count()} cpus, python {platform.python_version()}")
        for model in args.models:
            report(bench_model(model, args))
        return
    args.peer_recipes = [r.strip() for r in (args.peer_recipes or "Q8_0,Q4_K_M").split(",") if r.strip()]
    args.peer_args = shlex.split(args.peer_args or "")
    args.serve_args = serve_args_beside_llama_server(args.serve_args)
    args.runs = args.runs if args.runs is not None else 2
    args.work = args.work or ROOT / ".cache" / "bench" / "llama-server"
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    from serve_peer import compare_with_peer  # the llama-server half, beside it (it imports this module's load)

    compare_with_peer(args)


if __name__ == "__main__":
    main()
