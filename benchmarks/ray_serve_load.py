"""Scale-out through Ray Serve (docs/performance.md#targets): serve_load.py's streaming load against `gptedge serve`
direct and against Ray Serve with 1 and 2 replicas, every server process on 1 ONNX Runtime thread.

    python benchmarks/ray_serve_load.py MODEL_DIR [--clients 1,8] [--new 128] [--prompt 32] [--requests 2]

First `gptedge serve MODEL --threads 1` on loopback; then a local two-node Ray cluster (two `ray start` processes,
1 CPU each, on 127.0.0.2 / 127.0.0.3, proxy on the head only and routing by queue length rather than locality)
running gptedge.serve.ray_app with 1 replica, then 2 (one per node). Each C clients send --requests streaming
completions one after another (seeded random --prompt-token prompts, --new tokens, greedy, ignore_eos). Needs the
`ray` and `test` extras (httpx).

Printed: per setup and C, total tok/s, TTFT p50/p99, ITL p50/p99, one client's decode rate; then the targets:
2 replicas >= 1.7x one replica's aggregate tok/s at the most clients; Ray's proxy costs <= 10 % of one client's
decode tok/s against `gptedge serve` direct; TTFT p99 at the most clients (recorded, no target). On a 2-core
machine Ray's own processes (GCS, raylets, proxy, controller) and the load generator share the cores with the
replicas: the figures are this machine's, not a cluster's. Timings mean something only on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import serve_load  # beside this script

HERE = Path(__file__).resolve().parent
CLUSTER_ENV = {"RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": "gptedge.serve.ray_proxy:proxy_middlewares",
               "RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING": "0"}


def machine() -> str:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), []))
    isa = [n for n, f in (("AVX2", "avx2"), ("AVX512-VNNI", "avx512_vnni"), ("AMX", "amx_tile")) if f in flags]
    import onnxruntime
    import ray

    from gptedge import __version__
    return (f"{model} ({'/'.join(isa) or 'no AVX2'}), {os.cpu_count()} cpus; python {platform.python_version()}, "
            f"gptedge {__version__}, onnxruntime {onnxruntime.__version__}, ray {ray.__version__}; "
            f"{datetime.datetime.now().isoformat(timespec='minutes')}")


def measure(url: str, prompts, args) -> list[dict]:
    asyncio.run(serve_load.run_clients(url, prompts, 1, 1, 8))  # warm-up
    rows = []
    for c in args.clients:
        timings, wall = asyncio.run(serve_load.run_clients(url, prompts, c, args.requests, args.new))
        gaps = [g for t in timings for g in t.gaps]
        rows.append({"clients": c, "tok_s": sum(t.tokens for t in timings) / wall,
                     "ttft_p50": serve_load.pct([t.ttft for t in timings], 50),
                     "ttft_p99": serve_load.pct([t.ttft for t in timings], 99),
                     "itl_p50": serve_load.pct(gaps, 50), "itl_p99": serve_load.pct(gaps, 99),
                     "decode_rate": float(np.median([t.decode_rate for t in timings]))})
    return rows


def direct(model: Path, prompts, args) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = serve_load.start_server(model, 1, args.max_batch, Path(tmp) / "serve.log")
        try:
            return measure(url, prompts, args)
        finally:
            serve_load.stop_server(proc)


def through_ray(model: Path, prompts, args) -> dict[int, list[dict]]:
    import httpx
    import ray
    from ray import serve

    from gptedge.serve.ray_app import app
    from gptedge.serve.ray_local import LocalCluster, NodeSpec, free_port

    port = free_port()
    url, results = f"http://127.0.0.1:{port}", {}
    with LocalCluster([NodeSpec(1), NodeSpec(1)], env=CLUSTER_ENV) as cluster:
        ray.init(address=cluster.address, log_to_driver=False, namespace="serve")
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
            for replicas in (1, 2):
                application = app({"model": str(model), "model_name": "bench", "threads": 1,
                                   "max_batch": args.max_batch, "max_queue": 256, "num_replicas": replicas})
                serve.run(application, name="bench", route_prefix="/")  # 1 CPU a node: one replica per node
                deadline = time.monotonic() + 300
                while httpx.get(f"{url}/health", timeout=30).status_code != 200 and time.monotonic() < deadline:
                    time.sleep(0.5)
                results[replicas] = measure(url, prompts, args)
        finally:
            ray.shutdown()
    return results


def table(title: str, rows: list[dict]) -> None:
    print(f"\n### {title}\n")
    print("| clients | total tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | one request's "
          "decode tok/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['clients']} | {r['tok_s']:.1f} | {r['ttft_p50']:.1f} | {r['ttft_p99']:.1f} | {r['itl_p50']:.2f} | "
              f"{r['itl_p99']:.2f} | {r['decode_rate']:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--clients", default="1,8", help="Comma list of concurrent client counts (include 1).")
    ap.add_argument("--prompt", type=int, default=32, help="Prompt tokens.")
    ap.add_argument("--new", type=int, default=128, help="New tokens per request.")
    ap.add_argument("--requests", type=int, default=2, help="Requests each client sends, one after another.")
    ap.add_argument("--max-batch", type=int, default=8, help="Each server's / replica's max batch.")
    args = ap.parse_args()
    args.clients = sorted({int(c) for c in args.clients.split(",")} | {1})
    from gptedge.measure.bench import bench_prompts
    from gptedge.runtime.modeldir.manifest import read_manifest

    manifest = read_manifest(args.model)
    prompts = bench_prompts(manifest.shape.vocab_size, max(args.clients) * args.requests, args.prompt)
    print(f"ray_serve_load: {args.model} ({manifest.precision}); prompt {args.prompt}, new {args.new} (greedy, "
          f"ignore_eos), {args.requests} requests per client, max batch {args.max_batch}, 1 thread per server")
    print(f"machine: {machine()}")
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    plain = direct(args.model, prompts, args)
    ray_rows = through_ray(args.model, prompts, args)
    table("gptedge serve --threads 1 (direct)", plain)
    table("Ray Serve, 1 replica (1 CPU, 1 thread)", ray_rows[1])
    table("Ray Serve, 2 replicas (one per node, 1 CPU and 1 thread each)", ray_rows[2])
    most = max(args.clients)
    one, two = ray_rows[1][-1]["tok_s"], ray_rows[2][-1]["tok_s"]
    direct_rate, ray_rate = plain[0]["decode_rate"], ray_rows[1][0]["decode_rate"]
    print(f"\n- 2 replicas vs 1 at {most} clients: {two / one:.2f}x (target >= 1.7x): "
          f"{'met' if two >= 1.7 * one else 'missed'}")
    print(f"- one client through Ray's proxy: {ray_rate:.1f} tok/s vs {direct_rate:.1f} direct, costs "
          f"{1 - ray_rate / direct_rate:.1%} (target <= 10 %): {'met' if ray_rate >= 0.9 * direct_rate else 'missed'}")
    print(f"- TTFT p99 at {most} clients: direct {plain[-1]['ttft_p99']:.1f} ms, Ray 1 replica "
          f"{ray_rows[1][-1]['ttft_p99']:.1f} ms, 2 replicas {ray_rows[2][-1]['ttft_p99']:.1f} ms (recorded)")


if __name__ == "__main__":
    main()
