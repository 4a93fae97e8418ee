"""Load benchmark of `gptedge serve` on a classifier dir: C concurrent clients, each sending R single-example
POST /v1/classify requests back to back; requests/s, and how many runs the server's batching worker made.

    python - <<'EOF'   # a GPT-2-small-shape entailment head (random init, seeded): tests/support/task_checkpoints.py
    from pathlib import Path
    from tests.task_checkpoints import make_checkpoint
    from gptedge.export.head_export import export_task
    ck = make_checkpoint("gpt2-seq", Path(".cache/bench/ck-entail"), n_positions=1024, n_embd=768, n_layer=12,
                         n_head=12)
    export_task(ck, Path(".cache/bench/entail-small"), task="entailment")
    EOF
    gptedge serve .cache/bench/entail-small --port 18631 --device cpu --threads 2 --max-rows 32 &
    python benchmarks/serve_classify_load.py http://127.0.0.1:18631 [--clients 16] [--requests 8]

Run it against servers started with --max-rows 1 (every request runs alone) and the default 32 to see what
sharing runs buys. Printed: requests/s over the wall time, and the server's requests and batches from /metrics
(gptedge_classify_requests_total, _batches_total) over the measured span. Needs httpx (the `test` extra).
Timings mean something only on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time

import httpx

TEXTS = ["It is a truth universally acknowledged, that a single man in possession of a good fortune",
         "must be in want of a wife.", "However little known the feelings or views of such a man may be",
         "on his first entering a neighbourhood, this truth is so well fixed in the minds of the surrounding families"]


def classify_metrics(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {k: float(v) for k, v in re.findall(r"^(gptedge_classify_\S+) (\S+)$", text, re.M)}


async def client(http: httpx.AsyncClient, c: int, requests: int) -> None:
    for i in range(requests):  # one premise / hypothesis pair a request, different neighbours per client
        r = await http.post("/v1/classify", json={"input": [[TEXTS[(c + i) % 4], TEXTS[(c + i + 1) % 4]]]})
        r.raise_for_status()


async def measure(url: str, clients: int, requests: int) -> str:
    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        await client(http, 0, 2)  # warm-up
        before = classify_metrics(url)
        started = time.perf_counter()
        await asyncio.gather(*(client(http, c, requests) for c in range(clients)))
        elapsed = time.perf_counter() - started
    after = classify_metrics(url)
    n = clients * requests
    served = after["gptedge_classify_requests_total"] - before["gptedge_classify_requests_total"]
    batches = after["gptedge_classify_batches_total"] - before["gptedge_classify_batches_total"]
    return (f"clients={clients} requests={n} in {elapsed:.2f}s: {n / elapsed:.1f} req/s; server: {served:.0f} "
            f"requests in {batches:.0f} batches ({served / max(batches, 1):.1f} a batch)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=8, help="requests per client, one after another")
    args = parser.parse_args()
    print(asyncio.run(measure(args.url.rstrip("/"), args.clients, args.requests)))


if __name__ == "__main__":
    main()
