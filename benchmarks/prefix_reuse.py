"""Prefix reuse in `gptedge serve` (docs/serving.md#prefix-reuse): time to first token with and without it.

    python benchmarks/make_gpt2_small.py --out .cache/bench/gpt2-small
    gptedge export .cache/bench/gpt2-small -o .cache/bench/fp32-kvb --graph kv_buffer
    python benchmarks/prefix_reuse.py .cache/bench/fp32-kvb [--prefix 900] [--system 900] [--clients 8] \\
        [--requests 4] [--rounds 3] [--threads 2] [--max-batch 8] [--out FILE.md]

Two measurements, each against a `gptedge serve MODEL --port 0` of its own on loopback (greedy, `ignore_eos`,
streamed; time to first token = request sent -> first text chunk, as benchmarks/serve_load.py reads it):

1. **A second request sharing a prefix.** Per round, a fresh seeded --prefix of random ids; request A is the
   prefix + --suffix ids of its own, then, once A has ended, request B is the prefix + other --suffix ids. With
   reuse on, B finds the prefix's blocks cached; the same pair against a server with `--prefix-cache-mb 0` is the
   control (both prefilled whole). Reported: median TTFT of A and B and A/B, per server (target: >= 5x with reuse).
2. **--clients clients sharing a system prompt.** Per round and server, one warm-up request with a fresh --system
   prompt (what earlier clients would have left cached), then --clients clients at once, each sending --requests
   streams one after another: the system prompt + --suffix ids of their own. Reported: TTFT p50 / p99 over every
   request with reuse and without, and the ratio (target: p99 with reuse <= 0.5x without).

The two servers' runs interleave (round 1: reuse on, then off; round 2 the same) so drift hits both. /metrics'
prefix-cache counters are read after each run to show the reuse happened. Timings mean something only on a quiet
machine. The model's context must hold --prefix (or --system) + --suffix + --new positions: GPT-2 small's 1,024
does for the defaults. Needs the `serve` and `test` extras (httpx).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # serve_load beside it
from serve_load import one_request, pct, start_server, stop_server  # noqa: E402 - after the path line above
from serve_report import write_atomic  # noqa: E402 - after the path line above

SERVERS = {"reuse": [], "no reuse": ["--prefix-cache-mb", "0"]}  # extra `gptedge serve` options of each


def ids(rng: np.random.Generator, vocab: int, n: int) -> list[int]:
    return rng.integers(0, vocab, n).tolist()


def prefix_counters(url: str) -> dict[str, float]:
    import httpx

    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {name: float(v) for name, v in re.findall(r"^gptedge_prefix_cache_(\w+) (\S+)$", text, re.M)}


async def second_request(url: str, prefix: list[int], suffixes: list[list[int]], new: int) -> list[float]:
    """TTFT (s) of prefix + suffixes[0], then, after it ended, of prefix + suffixes[1]."""
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        return [(await one_request(http, prefix + s, new)).ttft for s in suffixes]


async def shared_system_prompt(url: str, system: list[int], questions: list[list[list[int]]], new: int,
                               warm: list[int]) -> list[float]:
    """One warm-up request (system + warm), then every client's questions at once -> every request's TTFT (s)."""
    import httpx

    limits = httpx.Limits(max_connections=len(questions) + 1, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        await one_request(http, system + warm, new)

        async def client(qs: list[list[int]]) -> list[float]:
            return [(await one_request(http, system + q, new)).ttft for q in qs]

        done = await asyncio.gather(*(client(qs) for qs in questions))
    return [t for ts in done for t in ts]


def run(args) -> str:
    from gptedge.runtime.modeldir.manifest import read_manifest

    shape = read_manifest(args.model).shape
    longest = max(args.prefix, args.system) + args.suffix + args.new
    if longest > shape.context_length:
        raise SystemExit(f"error: {longest} positions (prefix or system + suffix + new) pass the model's context "
                         f"of {shape.context_length}")
    rng = np.random.default_rng(args.seed)
    pairs = {name: [] for name in SERVERS}  # [(ttft A, ttft B)] per round
    loads = {name: [] for name in SERVERS}  # every request's TTFT
    counters = {name: {} for name in SERVERS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, extra in SERVERS.items():
                prefix, system = ids(rng, shape.vocab_size, args.prefix), ids(rng, shape.vocab_size, args.system)
                suffixes = [ids(rng, shape.vocab_size, args.suffix) for _ in range(2)]
                questions = [[ids(rng, shape.vocab_size, args.suffix) for _ in range(args.requests)]
                             for _ in range(args.clients)]
                proc, url = start_server(args.model, args.threads, args.max_batch, Path(tmp) / f"{r}-{name}.log",
                                         [*extra, "--device", args.device])
                try:
                    asyncio.run(second_request(url, ids(rng, shape.vocab_size, 8), [[1], [2]], 2))  # warm-up
                    pairs[name].append(tuple(asyncio.run(second_request(url, prefix, suffixes, args.new))))
                    loads[name] += asyncio.run(shared_system_prompt(url, system, questions, args.new,
                                                                    ids(rng, shape.vocab_size, args.suffix)))
                    counters[name] = prefix_counters(url)
                finally:
                    stop_server(proc)
                print(f"round {r + 1}/{args.rounds}, {name}: done", file=sys.stderr)
    return report(args, pairs, loads, counters)


def report(args, pairs: dict, loads: dict, counters: dict) -> str:
    lines = [f"`python benchmarks/prefix_reuse.py {args.model} --prefix {args.prefix} --system {args.system} "
             f"--suffix {args.suffix} --new {args.new} --clients {args.clients} --requests {args.requests} "
             f"--rounds {args.rounds} --threads {args.threads} --max-batch {args.max_batch}`", "",
             f"A second request sharing a {args.prefix}-token prefix (medians of {args.rounds} rounds):", "",
             "| server | TTFT first (ms) | TTFT second (ms) | first / second |", "|---|---|---|---|"]
    for name, rows in pairs.items():
        a, b = (float(np.median([row[i] for row in rows])) * 1000 for i in (0, 1))
        lines.append(f"| {name} | {a:.1f} | {b:.1f} | {a / b:.2f}x |")
    lines += ["", f"{args.clients} clients sharing a {args.system}-token system prompt, {args.requests} requests "
              f"each, {args.rounds} rounds ({sum(len(v) for v in loads.values()) // len(loads)} requests a server):",
              "", "| server | TTFT p50 (ms) | TTFT p99 (ms) |", "|---|---|---|"]
    for name, ttfts in loads.items():
        lines.append(f"| {name} | {pct(ttfts, 50):.1f} | {pct(ttfts, 99):.1f} |")
    lines += ["", f"TTFT p99 with reuse / without: {pct(loads['reuse'], 99) / pct(loads['no reuse'], 99):.2f}x", "",
              "The reuse server's last run, /metrics: " + ", ".join(
                  f"{k} {v:g}" for k, v in counters["reuse"].items()) + "."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--prefix", type=int, default=900, help="tokens the second request shares with the first")
    ap.add_argument("--system", type=int, default=900, help="tokens of the clients' shared system prompt")
    ap.add_argument("--suffix", type=int, default=32, help="tokens of each request's own after the shared part")
    ap.add_argument("--new", type=int, default=8, help="tokens generated per request")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=4, help="streams each client sends one after another")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="also write the tables to this .md file")
    args = ap.parse_args()
    text = run(args)
    print(text)
    if args.out:
        write_atomic(args.out, text)


if __name__ == "__main__":
    main()
