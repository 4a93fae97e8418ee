"""Where the serving engine's thread spends a load's wall time: its turns traced, then summed.

    python benchmarks/serve_load.py DIR --device cuda --clients 64 --client-procs 8 --trace OUT/trace
    python benchmarks/engine_trace.py summary OUT/trace.*.jsonl

`serve_load.py --trace PREFIX` starts the server through this file (`engine_trace.py serve ...`: the engine's
turns wrapped, then `gptedge serve` as usual) and prints the summary after the load; the server writes
PREFIX.PID.jsonl as it exits. One JSON row per event: ["pr", start, end, waiting, running] a prefill turn (waiting:
requests queued when it began), ["de", start, end, [rows, stepped ahead], running] a decode turn (stepped ahead: its
step was taken from a chain run ahead, `runtime/serving/step_ahead.py`), ["su", at, 0, prompts, 0] a submission
(the event loop handing requests to the engine). Times are `time.perf_counter()` seconds.

The summary: each kind of turn's count, total and mean wall time (decode turns by batch size, plain or stepped
ahead; in a steady chain a decode turn's wall time is the chain's step period), and for each burst of submissions
(gaps under 20 ms) how long it took and how long after its first submission a full batch (the most rows any decode
turn stepped) was stepping again: at many
clients whose requests start together, what a round of admissions costs. What it found on an H200:
`results/gpu-2026-11-27-host.md`.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
from collections import defaultdict

TRACE_ENV = "GPTEDGE_ENGINE_TRACE"  # the server's trace file prefix (set by serve_load.py --trace)
BURST_GAP_S = 0.02  # submissions closer than this belong to one burst


def install(prefix: str) -> None:
    """Wrap the engine's turns and submissions; write PREFIX.PID.jsonl at exit."""
    from gptedge.runtime.serving.engine import Engine

    rows: list[tuple] = []
    clock = time.perf_counter

    def wrap(name: str, kind: str, info) -> None:
        turn = getattr(Engine, name)

        def traced(self, *args, **kwargs):
            start, before = clock(), info(self)
            try:
                return turn(self, *args, **kwargs)
            finally:
                rows.append((kind, start, clock(), before, len(self._running)))

        setattr(Engine, name, traced)

    wrap("_prefill_turn", "pr", lambda self: len(self._waiting))
    wrap("_decode_step", "de", lambda self: (len(self._running), bool(self._ahead is not None and self._ahead.out)))
    submit_all = Engine.submit_all

    def submitted(self, requests, on_events):
        rows.append(("su", clock(), 0, len(requests), 0))
        return submit_all(self, requests, on_events)

    Engine.submit_all = submitted

    def dump() -> None:
        if rows:
            with open(f"{prefix}.{os.getpid()}.jsonl", "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)

    atexit.register(dump)


def summary(rows: list[list]) -> list[str]:
    """The lines described above, for one trace's rows."""
    turns = [r for r in rows if r[0] != "su"]
    if not turns:
        return ["no engine turns traced"]
    span = turns[-1][2] - turns[0][1]
    full_rows = max((r[3][0] for r in turns if r[0] == "de"), default=1)  # the batch when full (--max-batch rows)
    busy: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for kind, start, end, info, _ in turns:
        if kind == "pr":
            if not info:
                continue  # nothing waiting: a turn that ran nothing (or a long prompt's next chunk)
            key = "prefill turn"
        else:
            n, ahead = info
            key = (f"decode turn, {'full' if n >= full_rows else f'16-{full_rows - 1}' if n >= 16 else '1-15'} "
                   f"rows, {'stepped ahead' if ahead else 'plain'}")
        busy[key] += end - start
        count[key] += 1
    submits = [r[1] for r in rows if r[0] == "su"]
    out = [f"span {span * 1e3:.0f} ms (from the first turn, the warm-up's included), {len(submits)} submissions, "
           f"the engine in turns {sum(busy.values()) / span:.0%} of it"]
    out += [f"  {k:38s} n={count[k]:5d}  total {busy[k] * 1e3:8.1f} ms  mean {busy[k] / count[k] * 1e3:6.2f} ms"
            for k in sorted(busy)]
    bursts: list[list[float]] = []
    for at in submits:
        if bursts and at - bursts[-1][-1] <= BURST_GAP_S:
            bursts[-1].append(at)
        else:
            bursts.append([at])
    decodes = [(r[1], r[3][0]) for r in turns if r[0] == "de"]
    for burst in bursts:
        if len(burst) < 2:
            continue
        again = next((at for at, n in decodes if at >= burst[0] and n >= full_rows), None)
        out.append(f"  burst of {len(burst):3d} submissions over {(burst[-1] - burst[0]) * 1e3:6.1f} ms; "
                   f"{full_rows} rows stepping {'never' if again is None else f'{(again - burst[0]) * 1e3:.1f} ms'}"
                   " after its first")
    return out


def read(path: str) -> list[list]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def main() -> None:
    if len(sys.argv) >= 2 and sys.argv[1] == "serve":  # the server: traced, then `gptedge serve ARGS`
        install(os.environ[TRACE_ENV])
        from gptedge.cli import main as cli

        sys.argv = ["gptedge", *sys.argv[1:]]
        cli()
        return
    if len(sys.argv) >= 3 and sys.argv[1] == "summary":
        for path in sys.argv[2:]:
            print(f"== {path}")
            print("\n".join(summary(read(path))))
        return
    print(__doc__)
    if not (len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help")):
        sys.exit(2)


if __name__ == "__main__":
    main()
