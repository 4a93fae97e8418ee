"""Where one streaming client's tokens cost CPU in `gptedge serve`, next to the bare decode loop (`gptedge bench`).

    python benchmarks/serve_overhead.py MODEL_DIR [--requests 4] [--prompt 32] [--new 128] [--threads 2]
        [--serve-args='--spin'] [--bench-spin on|off|default] [--repeat 3] [--clients 1]

A cost breakdown, not a speed figure: the per-token CPU seconds of each part of the server process, measured the
same way for `serve` (one client streaming --requests completions one after another, --prompt seeded ids, --new
greedy tokens, ignore_eos; --clients N: N such clients at once) and for the bench loop (`generate_batch` of one
prompt, `with_text=False`, as `gptedge bench` runs it), in turns (bench, serve, bench, serve, ...: --repeat pairs).

Per generated token (each request's prefill counted in, as one of its runs):
- `ort_wall_us`: wall time inside `InferenceSession.run_with_iobinding` (the model itself);
- `ort_runs`: session runs per token (1.00: the prefill gives the first token, one decode step each other one);
- `engine_py_us`: CPU of the thread that calls the session (the engine thread in serve, the main one in bench),
  outside the session runs: token selection, text stream, events, the pool's bookkeeping;
- `loop_us`: CPU of the serve process's main thread (uvicorn's event loop: SSE, JSON, asyncio hops);
- `other_py_us`: CPU of the process's other Python threads (tokenizer thread pool, mask worker);
- `ort_pool_us`: CPU of the threads Python did not start (ONNX Runtime's intra-op pool: with spinning on, the
  spin-wait too);
- `cpu_us`: the process's CPU (every thread living at the end; from /proc's schedstat, ns);
- `wall_us`: the client's (or the loop's) wall time per token;
- below the table, the serve process's CPU per token by thread name (MainThread: the event loop; gptedge-engine;
  gptedge-step: the step run ahead; ort: threads Python did not start).
Shares are CPU seconds per token: on a shared machine they move less than speeds, and only ratios measured
back-to-back mean anything.

The serve child is this script itself (`--child-serve`): it patches the session's run and the engine thread's
timers in, then runs `gptedge serve`; SIGUSR1 makes it write a snapshot of its counters (and every thread's CPU,
from /proc) to the file named in $SERVE_OVERHEAD_SNAPSHOT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import load_prompts, one_request, stop_server  # noqa: E402 - after the sys.path line above

SNAPSHOT_ENV = "SERVE_OVERHEAD_SNAPSHOT"
INSTANT_ENV = "SERVE_OVERHEAD_INSTANT_AFTER"  # N: the child's session runs after the first N return at once
DEVICE_POOL_ENV = "SERVE_OVERHEAD_DEVICE_POOL"  # set: the child serves through the GPU's slot pool (--device-pool)
ORT_CONFIG_ENV = "SERVE_OVERHEAD_ORT_CONFIG"  # KEY=VALUE,...: session config entries both children add (an A/B)


class Counters:
    """Session runs (count, wall, the calling thread's CPU) and which thread is which."""

    def __init__(self):
        self.runs, self.run_wall, self.run_cpu = 0, 0.0, 0.0
        self.caller_tid: int | None = None

    def patch(self) -> None:
        import onnxruntime as ort

        original, counters = ort.InferenceSession.run_with_iobinding, self
        real_runs = int(os.environ.get(INSTANT_ENV) or 0) or None  # then every run returns at once (--instant)

        def timed(session, *args, **kwargs):
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                if real_runs is not None and counters.runs >= real_runs:
                    return None  # the bound outputs keep the last real run's values: valid ids and logits
                return original(session, *args, **kwargs)
            finally:
                counters.run_cpu += time.thread_time() - cpu
                counters.run_wall += time.perf_counter() - wall
                counters.runs += 1
                counters.caller_tid = threading.get_native_id()

        ort.InferenceSession.run_with_iobinding = timed
        entries = [e.split("=", 1) for e in os.environ.get(ORT_CONFIG_ENV, "").split(",") if e]
        if entries:
            made = ort.InferenceSession.__init__

            def configured(session, path_or_bytes, sess_options=None, *args, **kwargs):
                sess_options = sess_options or ort.SessionOptions()
                for key, value in entries:
                    sess_options.add_session_config_entry(key, value)
                made(session, path_or_bytes, sess_options, *args, **kwargs)

            ort.InferenceSession.__init__ = configured

    def snapshot(self) -> dict:
        python = {t.native_id for t in threading.enumerate()}
        threads = {}
        for task in Path("/proc/self/task").iterdir():  # schedstat's first field: ns on a CPU (stat's: 10 ms ticks)
            threads[int(task.name)] = int((task / "schedstat").read_text().split()[0]) / 1e9
        main = threading.main_thread().native_id
        caller = self.caller_tid
        names = {t.native_id: t.name for t in threading.enumerate()}
        by_name: dict[str, float] = {}  # CPU seconds by Python thread name ("ort" for the rest)
        for tid, cpu in threads.items():
            name = re.sub(r"_\d+$", "", names.get(tid, "ort"))  # a pool's workers together
            by_name[name] = by_name.get(name, 0.0) + cpu
        return {"runs": self.runs, "run_wall": self.run_wall, "run_cpu": self.run_cpu, "by_name": by_name,
                "caller": threads.get(caller, 0.0) if caller else 0.0,
                "main": threads.get(main, 0.0) if main != caller else 0.0,
                "other_py": sum(v for t, v in threads.items() if t in python and t not in (main, caller)),
                "ort_pool": sum(v for t, v in threads.items() if t not in python),
                "cpu": sum(threads.values()), "at": time.perf_counter()}


def per_token(before: dict, after: dict, tokens: int, wall: float) -> dict:
    d = {k: after[k] - before[k] for k in before if k != "by_name"}
    us = 1e6 / tokens
    return {"tokens": tokens, "wall_us": wall * us, "ort_wall_us": d["run_wall"] * us, "ort_runs": d["runs"] / tokens,
            "engine_py_us": (d["caller"] - d["run_cpu"]) * us, "loop_us": d["main"] * us,
            "other_py_us": d["other_py"] * us, "ort_pool_us": d["ort_pool"] * us, "cpu_us": d["cpu"] * us,
            "threads_us": {k: (v - before["by_name"].get(k, 0.0)) * us for k, v in after["by_name"].items()}}


def use_device_slot_pool() -> None:
    """The serving engine on the GPU's pool (DeviceSlotPool: tokens picked in the graph, the next step run during
    emission) over the CPU session, as `serve --device cuda` runs: decode steps through a second session of the
    decode graph (its own ArgMax), first tokens picked by the ArgMax session, as on a GPU (uncaptured here). With a
    tiny model, what is left per token is the host's own cost, the part a GPU server is bound by at many clients."""
    from gptedge.runtime import model as model_module
    from gptedge.runtime.graphs.cuda_graph import decode_graph_bytes
    from gptedge.runtime.graphs.device_slot_pool import DeviceSlotPool
    from gptedge.runtime.graphs.kv_buffer_graph import KVBufferGraph
    from gptedge.runtime.graphs.session import make_session

    def sequence_pool(variant, capacity: int, max_length: int):
        return DeviceSlotPool(variant, capacity, max_length, variant.pool_decoder(capacity), variant.pool_decoder)

    def decode_session(variant, manifest, graph, device, config) -> None:  # the GPU's, on the CPU
        variant.pick_on_device = True
        variant.enable_cuda_graphs(make_session(decode_graph_bytes(graph.read_bytes()), device="cpu", config=config))

    KVBufferGraph.sequence_pool = sequence_pool
    model_module._enable_cuda_graphs = decode_session


def child_serve(argv: list[str]) -> None:
    counters = Counters()
    counters.patch()
    if os.environ.get(DEVICE_POOL_ENV):
        use_device_slot_pool()
    path = Path(os.environ[SNAPSHOT_ENV])

    def dump(signum, frame) -> None:
        path.write_text(json.dumps(counters.snapshot()))

    signal.signal(signal.SIGUSR1, dump)
    from gptedge.cli import main

    sys.argv = ["gptedge", "serve", *argv]
    main()


def snapshot_of(proc: subprocess.Popen, path: Path) -> dict:
    path.unlink(missing_ok=True)
    proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size:
            time.sleep(0.05)
            return json.loads(path.read_text())
        time.sleep(0.02)
    raise SystemExit("the server wrote no snapshot")


def measure_serve(model: Path, prompts: list[list[int]], args, tmp: Path) -> dict:
    snap = tmp / "snapshot.json"
    log = tmp / "serve.log"
    cmd = [sys.executable, __file__, "--child-serve", str(model), "--port", "0", "--model-name", "bench",
           "--threads", str(args.threads), "--max-batch", "16", "--max-queue", "256", *args.serve_args]
    with open(log, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, SNAPSHOT_ENV: str(snap)})
    try:
        deadline, url = time.monotonic() + 300, None
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            found = re.search(r"on (http://127\.0\.0\.1:\d+)", log.read_text())
            url = found.group(1) if found else time.sleep(0.1)
        if url is None:
            raise SystemExit(f"the server did not start:\n{log.read_text()}")

        async def run() -> tuple[dict, int, float]:
            import httpx

            async with httpx.AsyncClient(base_url=url, timeout=600) as http:
                await one_request(http, prompts[-1], 8)  # warm-up
                before = snapshot_of(proc, snap)
                started = time.perf_counter()

                async def client(mine: list[list[int]]) -> int:  # its requests one after another
                    return sum([(await one_request(http, p, args.new)).tokens for p in mine])

                n = args.clients[0]  # client c sends prompts c, c + n, ...: every prompt once
                tokens = sum(await asyncio.gather(*(client(prompts[c:n * args.requests:n]) for c in range(n))))
                wall = time.perf_counter() - started
                return per_token(before, snapshot_of(proc, snap), tokens, wall), tokens, wall

        row, _, _ = asyncio.run(run())
        return row
    finally:
        stop_server(proc)


def measure_bench(model: Path, prompts: list[list[int]], args) -> dict:
    """In a child process of its own (a fresh session, as the server gets): `generate_batch` of one prompt."""
    out = subprocess.run([sys.executable, __file__, "--child-bench", str(model), "--threads", str(args.threads),
                          "--bench-spin", args.bench_spin, "--requests", str(args.requests),
                          "--prompt", str(args.prompt), "--new", str(args.new)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def child_bench(args) -> None:
    counters = Counters()
    counters.patch()
    from gptedge.runtime import SessionConfig, load
    from gptedge.runtime.modeldir.manifest import read_manifest

    spin = {"on": True, "off": False, "default": None}[args.bench_spin]
    model = load(args.model, session=SessionConfig(threads=args.threads, spin=spin))
    prompts = load_prompts(read_manifest(args.model).shape.vocab_size, args)
    model.generate_batch([prompts[-1]], max_new_tokens=8, greedy=True, ignore_eos=True, with_text=False)
    before, tokens = counters.snapshot(), 0
    started = time.perf_counter()
    for p in prompts[:args.requests]:
        out = model.generate_batch([p], max_new_tokens=args.new, greedy=True, ignore_eos=True, with_text=False)
        tokens += len(out[0].ids)
    wall = time.perf_counter() - started
    print(json.dumps(per_token(before, counters.snapshot(), tokens, wall)))


COLUMNS = ("wall_us", "ort_wall_us", "ort_runs", "engine_py_us", "loop_us", "other_py_us", "ort_pool_us", "cpu_us")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child-serve":
        return child_serve(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3, help="bench/serve pairs, in turns")
    ap.add_argument("--serve-args", default="", help="Options appended to `gptedge serve`.")
    ap.add_argument("--bench-spin", choices=["on", "off", "default"], default="default",
                    help="The bench loop's ORT spin-waiting (default: ORT's own, as `gptedge bench`).")
    ap.add_argument("--ort-config", default="", help="KEY=VALUE,... session config entries for both sides "
                    "(e.g. session.intra_op.spin_duration_us=200).")
    ap.add_argument("--no-bench", action="store_true", help="Serve only (an A/B of serve options).")
    ap.add_argument("--clients", type=int, default=1, help="Concurrent streaming clients, each sending --requests "
                    "(the serve side; the bench loop stays one prompt).")
    ap.add_argument("--device-pool", action="store_true", help="Serve through the GPU's slot pool on the CPU (a "
                    "tiny model then leaves the host's own cost per token: what bounds serve --device cuda at many "
                    "clients).")
    ap.add_argument("--instant", action="store_true", help="With --device-pool: after the server's warm-up, every "
                    "model run returns at once (outputs left from the last real run): the host's ceiling, no model.")
    ap.add_argument("--child-bench", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path, help="Also write every row here.")
    args = ap.parse_args()
    if args.clients < 1:
        ap.error("--clients must be >= 1")
    args.clients = [args.clients]  # serve_load's shape: load_prompts makes max(clients) x requests prompts
    if args.child_bench:
        return child_bench(args)
    args.serve_args = args.serve_args.split()
    os.environ[ORT_CONFIG_ENV] = args.ort_config
    if args.device_pool:
        os.environ[DEVICE_POOL_ENV] = "1"
    if args.instant:
        if not args.device_pool or not args.no_bench:
            ap.error("--instant needs --device-pool and --no-bench")
        os.environ[INSTANT_ENV] = "64"  # the warm-up request's runs (and more) are real
    from gptedge.runtime.modeldir.manifest import read_manifest

    prompts = load_prompts(read_manifest(args.model).shape.vocab_size, args)
    rows: dict[str, list[dict]] = {"bench": [], "serve": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeat):
            if not args.no_bench:
                rows["bench"].append(measure_bench(args.model, prompts, args))
            rows["serve"].append(measure_serve(args.model, prompts, args, Path(tmp)))
    print("| per generated token | " + " | ".join(COLUMNS) + " |")
    print("|---|" + "---:|" * len(COLUMNS))
    for name, runs in rows.items():
        if not runs:
            continue
        for i, r in enumerate(runs):
            print(f"| {name} {i + 1} | " + " | ".join(f"{r[c]:.2f}" if c == "ort_runs" else f"{r[c]:.0f}"
                                                      for c in COLUMNS) + " |")
        med = {c: statistics.median(r[c] for r in runs) for c in COLUMNS}
        print(f"| {name} median | " + " | ".join(f"{med[c]:.2f}" if c == "ort_runs" else f"{med[c]:.0f}"
                                                  for c in COLUMNS) + " |")
    for r in rows["serve"]:  # the serve process's CPU per token by thread (the GIL's share: every Python thread's)
        print("serve threads, us per token: " + ", ".join(f"{k} {v:.1f}" for k, v in
                                                        sorted(r["threads_us"].items(), key=lambda kv: -kv[1])
                                                        if v >= 0.05))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
