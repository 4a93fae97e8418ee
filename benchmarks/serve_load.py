"""Load benchmark of `gptedge serve`: C concurrent clients streaming completions, per model.

    python benchmarks/make_gpt2_small.py --out .cache/bench/gpt2-small
    gptedge export .cache/bench/gpt2-small -o .cache/bench/fp32-kvb --graph kv_buffer
    gptedge quantize .cache/bench/fp32-kvb -o .cache/bench/dynamic-kvb --method dynamic
    python benchmarks/serve_load.py .cache/bench/fp32-kvb .cache/bench/dynamic-kvb \\
        [--clients 1,2,4,8,16] [--prompt 32] [--new 128] [--requests 2] [--threads 2] [--max-batch 16]

For each model it first times `generate` in-process (what `gptedge generate` runs: same prompts, threads and
greedy decoding), then starts `gptedge serve MODEL --port 0` on loopback in a process of its own, warms it up,
and for each C runs C clients at once, each sending --requests streaming completions one after another
(--prompt seeded random token ids, different for every request; --new tokens, greedy, `ignore_eos` so every
request decodes all of them). Needs the `serve` and `test` extras (httpx).

Printed per model: per C, total generated tok/s (all clients' tokens over the wall time), p50/p99 time to first
token (request sent -> first text chunk) and p50/p99 inter-token latency (gap between text chunks; a chunk
holding back half a UTF-8 character carries two tokens, so this errs high); then one client's decode rate
through HTTP next to generate's, and the server's peak RSS (VmHWM) next to the model's size on disk; and the
DESIGN §7/§10 targets as met or missed. Timings mean something only on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class RequestTiming:
    sent: float
    chunks: list[float] = field(default_factory=list)  # arrival time of each chunk with text
    tokens: int = 0

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


def start_server(model: Path, threads: int, max_batch: int, log: Path) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "gptedge.cli", "serve", str(model), "--port", "0", "--model-name", "bench",
           "--threads", str(threads), "--max-batch", str(max_batch), "--max-queue", "256"]
    with open(log, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
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


async def one_request(http, prompt: list[int], new_tokens: int) -> RequestTiming:
    body = {"model": "bench", "prompt": prompt, "max_tokens": new_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    timing = RequestTiming(time.perf_counter())
    async with http.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                timing.tokens = chunk["usage"]["completion_tokens"]
            elif chunk["choices"] and chunk["choices"][0]["text"]:
                timing.chunks.append(time.perf_counter())
    return timing


async def run_clients(url: str, prompts: list[list[int]], clients: int, per_client: int,
                      new_tokens: int) -> tuple[list[RequestTiming], float]:
    import httpx

    async def client(i: int, http) -> list[RequestTiming]:
        return [await one_request(http, prompts[(i * per_client + k) % len(prompts)], new_tokens)
                for k in range(per_client)]

    limits = httpx.Limits(max_connections=clients + 1)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        started = time.perf_counter()
        done = await asyncio.gather(*(client(i, http) for i in range(clients)))
        wall = time.perf_counter() - started
    return [t for ts in done for t in ts], wall


def pct(values, q) -> float:
    return float(np.percentile(values, q)) * 1000 if len(values) else float("nan")


def bench_model(model: Path, args) -> dict:
    from gptedge.runtime import SessionConfig, load
    from gptedge.runtime.bench import bench_prompts
    from gptedge.runtime.compare import graph_size
    from gptedge.runtime.manifest import read_manifest

    manifest = read_manifest(model)
    n_prompts = max(args.clients) * args.requests
    prompts = bench_prompts(manifest.shape.vocab_size, n_prompts, args.prompt)
    loaded = load(model, device="cpu", session=SessionConfig(threads=args.threads))
    loaded.generate(prompts[0], 8, greedy=True, ignore_eos=True)  # warm-up
    solo = [loaded.generate(p, args.new, greedy=True, ignore_eos=True).tokens_per_s for p in prompts[:3]]
    del loaded
    size_mib = graph_size(model, manifest.model_file) / 2**20

    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_server(model, args.threads, args.max_batch, Path(tmp) / "serve.log")
        try:
            asyncio.run(run_clients(url, prompts, 1, 1, 8))  # warm-up (and waits for the server to accept)
            rows = []
            for c in args.clients:
                timings, wall = asyncio.run(run_clients(url, prompts, c, args.requests, args.new))
                gaps = [g for t in timings for g in t.gaps]
                rows.append({"clients": c, "requests": len(timings), "tok_s": sum(t.tokens for t in timings) / wall,
                             "ttft_p50": pct([t.ttft for t in timings], 50), "ttft_p99": pct([t.ttft for t in timings], 99),
                             "itl_p50": pct(gaps, 50), "itl_p99": pct(gaps, 99),
                             "decode_rate": float(np.median([t.decode_rate for t in timings]))})
            rss = peak_rss_mib(proc.pid)
        finally:
            stop_server(proc)
    return {"model": str(model), "precision": manifest.precision, "rows": rows, "generate_tok_s": float(np.median(solo)),
            "peak_rss_mib": rss, "size_mib": size_mib}


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--clients", default="1,2,4,8,16", help="Comma list of concurrent client counts.")
    ap.add_argument("--prompt", type=int, default=32, help="Prompt tokens.")
    ap.add_argument("--new", type=int, default=128, help="New tokens per request.")
    ap.add_argument("--requests", type=int, default=2, help="Requests each client sends, one after another.")
    ap.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads (server and generate).")
    ap.add_argument("--max-batch", type=int, default=None, help="Server's --max-batch (default: the most clients).")
    args = ap.parse_args()
    args.clients = [int(c) for c in args.clients.split(",")]
    args.max_batch = args.max_batch or max(args.clients)
    print(f"serve_load: prompt {args.prompt}, new {args.new} (greedy, ignore_eos), {args.requests} requests per "
          f"client, server --max-batch {args.max_batch} --threads {args.threads}; "
          f"{platform.machine()}, {os.cpu_count()} cpus, python {platform.python_version()}")
    for model in args.models:
        report(bench_model(model, args))


if __name__ == "__main__":
    main()
